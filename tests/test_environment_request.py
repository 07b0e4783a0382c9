"""A task row's ``responses_create_params`` as the first chat request the loop sends
(``episode.environment.first_request``: pure, ``RequestError`` naming the field)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from miles_nemogym.episode.environment import first_request
from miles_nemogym.episode.run import responses_create_params
from miles_nemogym.errors import RequestError

TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look it up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    "strict": None,
}


def test_instructions_fold_the_leading_system_messages_into_one() -> None:
    params = {
        "instructions": "Be brief.",
        "input": [
            {"role": "system", "content": "Today is Monday."},
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        ],
    }
    messages, _ = first_request(params, None)
    assert messages == [
        {"role": "system", "content": "Be brief.\n\nToday is Monday."},
        {"role": "user", "content": "ab"},
    ]
    assert first_request({"input": "just text"}, None)[0] == [{"role": "user", "content": "just text"}]


def test_tools_sampling_and_extra_body_trainer_wins() -> None:
    params = {
        "input": "q",
        "tools": [TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "temperature": 0.2,
        "max_output_tokens": 100,
        "metadata": {"extra_body": '{"top_k": 5, "chat_template_kwargs": {"enable_thinking": false}}'},
    }
    _, body = first_request(params, {"temperature": 1.0, "max_tokens": 64, "min_p": None, "stop": ["</s>"]})
    assert body == {
        "temperature": 1.0,
        "max_tokens": 64,
        "top_k": 5,
        "chat_template_kwargs": {"enable_thinking": False},
        "stop": ["</s>"],
        "tools": [
            {
                "type": "function",
                "function": {"name": "lookup", "description": "Look it up.", "parameters": TOOL["parameters"]},
            }
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
    }
    # No tools: no tool_choice either (a chat server refuses tool_choice without tools).
    assert first_request({"input": "q", "tool_choice": "auto"}, None)[1] == {}


@pytest.mark.parametrize("strict", [True, False])
def test_a_tools_strict_flag_is_not_sent_to_the_policy(strict: bool) -> None:
    # NeMo-Gym 0.7.0's vllm_model, simple_agent's model server, drops a function tool's `strict`
    # before the engine renders the prompt (responses_api_models/vllm_model/app.py:589-601, called
    # at :619): chat templates that dump the whole tool (Qwen3's `tool | tojson`) would put it in
    # every tool-bearing prompt. Most NeMo-Gym rows set it (resources_servers/*/data/example.jsonl).
    _, body = first_request({"input": "q", "tools": [{**TOOL, "strict": strict}]}, None)
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "lookup", "description": "Look it up.", "parameters": TOOL["parameters"]},
        }
    ]


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0].content[0]"),
        ({"input": 5}, "input"),
    ],
)
def test_input_the_loop_cannot_send_names_the_item(params: dict[str, object], named: str) -> None:
    with pytest.raises(RequestError, match=re.escape(named)):
        first_request(params, None)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"metadata": {"extra_body": "{nope"}}, "extra_body"),
        ({"metadata": {"extra_body": "[1]"}}, "extra_body"),
    ],
)
def test_bad_tools_or_extra_body_name_the_field(params: dict[str, object], named: str) -> None:
    with pytest.raises(RequestError, match=re.escape(named)):
        first_request({"input": "q", **params}, None)


@pytest.mark.parametrize(
    "extra_body",
    [[["top_k", 5]], 5, "[1]", "{nope", {"top_k": 5}, '{"top_k": 5}'],
    ids=["pairs", "number", "list-text", "bad-text", "object", "object-text"],
)
def test_a_rows_extra_body_gets_one_verdict_on_an_environment_row_and_a_swe_row(extra_body: object) -> None:
    """One rule for metadata.extra_body: a value the SWE path refuses is refused by the loop too
    (a list of pairs was once sent by the loop as an object)."""

    def accepted(build: Callable[[], object]) -> bool:
        try:
            build()
        except RequestError:
            return False
        return True

    row = {"input": "q", "metadata": {"extra_body": extra_body}}
    on_environment = accepted(lambda: first_request(row, None))
    assert on_environment == accepted(lambda: responses_create_params({"metadata": {"extra_body": extra_body}}, {}))
    assert on_environment == (extra_body in ({"top_k": 5}, '{"top_k": 5}'))
    if on_environment:
        assert first_request(row, None)[1]["top_k"] == 5


@pytest.mark.parametrize("name", ["verify", "seed_session", "aggregate_metrics", "close_session", "", ".", "..", "a/b"])
def test_a_tool_named_for_a_resources_endpoint_or_a_path_is_refused(name: str) -> None:
    tool = {**TOOL, "name": name}
    with pytest.raises(RequestError, match=re.escape("tools[1].name")):
        first_request({"input": "q", "tools": [TOOL, tool]}, None)


# NeMo-Gym 0.7.0's simple_agent calls vllm_model, which turns the row's params into the chat body by
# nemo_gym/responses_converter.py (ResponsesConverter.responses_to_chat_completion_create_params) and
# then responses_api_models/vllm_model/app.py (VLLMModel._preprocess_chat_completion_create_params).


@pytest.mark.parametrize(
    ("text", "response_format"),
    [
        (
            {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}},
            {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True}},
        ),
        ({"format": {"type": "json_object"}}, {"type": "json_object"}),
        ({"format": {"type": "text"}}, None),
    ],
)
def test_text_format_becomes_response_format(text: dict[str, object], response_format: object) -> None:
    _, body = first_request({"input": "q", "text": text}, None)
    assert body.get("response_format") == response_format


def test_a_text_format_with_no_chat_form_is_refused() -> None:
    with pytest.raises(RequestError, match=re.escape("text.format")):
        first_request({"input": "q", "text": {"format": {"type": "grammar"}}}, None)


def test_reasoning_effort_is_sent_as_nemo_gym_sends_it() -> None:
    # grl_sokoban's and grl_tetris's rows carry it; NeMo-Gym's converter sends it as reasoning_effort
    # and refuses the reasoning fields it has no chat form for.
    assert first_request({"input": "q", "reasoning": {"effort": "medium"}}, None)[1] == {"reasoning_effort": "medium"}
    assert first_request({"input": "q", "reasoning": {"effort": None}}, None)[1] == {}
    with pytest.raises(RequestError, match=re.escape("responses_create_params.reasoning.summary")):
        first_request({"input": "q", "reasoning": {"effort": "low", "summary": "auto"}}, None)


def test_a_named_tool_choice_is_spelt_as_chat_completions_spells_it() -> None:
    params = {"input": "q", "tools": [TOOL], "tool_choice": {"type": "function", "name": "lookup"}}
    assert first_request(params, None)[1]["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    with pytest.raises(RequestError, match=re.escape("tool_choice")):
        first_request({"input": "q", "tool_choice": "required"}, None)  # a tool is required, none is offered


def test_the_rows_own_fields_win_over_its_extra_body() -> None:
    params = {
        "input": "q",
        "temperature": 0.2,
        "metadata": {
            "extra_body": '{"temperature": 0.9, "top_k": 5, "chat_template_kwargs": {"enable_thinking": true}}',
            "chat_template_kwargs": '{"enable_thinking": false}',
        },
    }
    _, body = first_request(params, None)
    assert body == {"temperature": 0.2, "top_k": 5, "chat_template_kwargs": {"enable_thinking": False}}
    assert first_request(params, {"temperature": 1.0})[1]["temperature"] == 1.0


def test_a_row_with_audio_is_refused_not_sent_as_text() -> None:
    # asr_with_pc's rows carry it; vllm_model splices it into the last user message.
    with pytest.raises(RequestError, match=re.escape("metadata.audio_data")):
        first_request({"input": "q", "metadata": {"audio_data": "data:audio/wav;base64,AAAA"}}, None)
