"""A task row's ``responses_create_params`` as the chat request the loop sends (pure functions)."""

from __future__ import annotations

import pytest

from miles_nemogym.simple_agent.chat_request import RowError, messages, request_body

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
    assert messages(params) == [
        {"role": "system", "content": "Be brief.\n\nToday is Monday."},
        {"role": "user", "content": "ab"},
    ]
    assert messages({"input": "just text"}) == [{"role": "user", "content": "just text"}]


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
    body = request_body(params, {"temperature": 1.0, "max_tokens": 64, "min_p": None, "stop": ["</s>"]})
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
    assert request_body({"input": "q", "tool_choice": "auto"}, None) == {}


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0].content[0]"),
        ({"input": 5}, "input"),
    ],
)
def test_input_the_loop_cannot_send_names_the_item(params: dict[str, object], named: str) -> None:
    with pytest.raises(RowError, match=named.replace("[", r"\[").replace("]", r"\]")):
        messages(params)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"metadata": {"extra_body": "{nope"}}, "extra_body"),
        ({"metadata": {"extra_body": "[1]"}}, "extra_body"),
    ],
)
def test_bad_tools_or_extra_body_name_the_field(params: dict[str, object], named: str) -> None:
    with pytest.raises(RowError, match=named.replace("[", r"\[").replace("]", r"\]")):
        request_body({"input": "q", **params}, None)
