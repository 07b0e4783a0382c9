"""The ``simple_agent`` loop through ``agent.run`` against loopback servers: stop rules, tool
errors, caps, cookies and every infrastructure failure (masked under its kind, never a reward)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from miles_nemogym.episode import environment
from miles_nemogym.errors import (
    CANCELLED,
    CLIENT_ERROR,
    INVALID_REQUEST,
    POLICY_FAILED,
    SEED_FAILED,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TLS,
    TRANSPORT_UNREACHABLE,
    VERIFIER_ERROR,
)
from miles_nemogym.runtime import current
from tests.support.agent_fixtures import fast_env
from tests.support.environment_episodes import ENV, chat, env_row, envs, episode, masked, run_env
from tests.support.fake_resources import fake_resources
from tests.support.ports import free_port
from tests.support.runtime_settings import UseSettings
from tests.support.scripted_chat import ScriptedChat, Turn, tool
from tests.support.tls import make_certificates

__all__ = ["chat", "fast_env"]  # fixtures used by name
pytestmark = pytest.mark.usefixtures("fast_env")

TOOL_OUTPUT_CAP = 64 * 1024
"""What the loop keeps of one tool answer."""


async def test_a_gold_episode_seeds_calls_tools_and_verifies(chat: ScriptedChat, use_settings: UseSettings) -> None:
    chat.script("ok", Turn(content="<think>t</think>", tool_calls=(tool("echo", a=1),)), Turn(content="done"))
    async with fake_resources(delay=0.02) as fake:
        out = await episode(use_settings, chat, fake.url, "ok")
    record = out["nemogym"]
    assert (out["reward"], record["mask_sample"], record["status"]) == (1.0, False, "ok")
    assert (record["turns"], record["tool_calls"]) == (2, 1)
    assert len(chat.requests("ok")) == 2 and len(fake.verified) == 1  # stopped at the turn without a tool call
    assert out["agent_metrics"]["total_tool_time"] >= 3 * 0.02  # seed + one tool + verify
    ((session, name, arguments),) = fake.tool_calls
    assert (name, arguments) == ("echo", {"a": 1}) and session in fake.seeded
    output = fake.verified[0]["response"]["output"]
    assert [i["type"] for i in output] == ["reasoning", "function_call", "function_call_output", "message"]
    assert output[0]["summary"] == [{"type": "summary_text", "text": "t"}]
    assert output[-1]["content"][0]["text"] == "done"


async def test_resources_server_down_is_masked_before_any_model_call(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="1")
    chat.script("down", Turn(content="x"))
    out = await asyncio.wait_for(episode(use_settings, chat, f"http://127.0.0.1:{free_port()}", "down"), 10)
    assert masked(out) == (True, 0.0, TRANSPORT_UNREACHABLE)
    # Nothing reached any server: the episode waited for it to come back, then gave up.
    assert "NEMO_GYM_OUTAGE_TIMEOUT=1s" in out["nemogym"]["failure_reason"]
    assert current().ledger.drain().outage_wait_s > 0
    assert chat.requests("down") == []


async def test_an_untrusted_resources_certificate_is_transport_tls_and_undelivered(
    chat: ScriptedChat, use_settings: UseSettings, tmp_path: Path
) -> None:
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="1")
    chat.script("tls", Turn(content="x"))
    async with fake_resources(tls=make_certificates(tmp_path).server_context()) as fake:
        out = await asyncio.wait_for(episode(use_settings, chat, fake.url, "tls"), 10)
    assert masked(out) == (True, 0.0, TRANSPORT_TLS)
    assert "NEMO_GYM_OUTAGE_TIMEOUT=1s" in out["nemogym"]["failure_reason"]  # waited: it never left
    assert current().ledger.drain().outage_wait_s > 0
    assert fake.seeded == {} and chat.requests("tls") == []


@pytest.mark.parametrize("mode", ["500", "garbage"])
async def test_seed_failing_or_garbage_is_masked(chat: ScriptedChat, use_settings: UseSettings, mode: str) -> None:
    chat.script(f"seed{mode}", Turn(content="x"))
    async with fake_resources(seed=mode) as fake:
        out = await episode(use_settings, chat, fake.url, f"seed{mode}")
    assert masked(out) == (True, 0.0, SEED_FAILED)
    assert chat.requests(f"seed{mode}") == [] and fake.verified == []


@pytest.mark.parametrize("mode", ["500", "garbage", "no_reward"])
async def test_verify_failing_or_garbage_is_masked(chat: ScriptedChat, use_settings: UseSettings, mode: str) -> None:
    chat.script(f"verify{mode}", Turn(content="x"))
    async with fake_resources(verify=mode) as fake:
        out = await episode(use_settings, chat, fake.url, f"verify{mode}")
    assert masked(out) == (True, 0.0, VERIFIER_ERROR)
    assert out["nemogym"]["turns"] == 1 and len(fake.verified) == 1


async def test_verify_masking_the_sample_keeps_its_kind(chat: ScriptedChat, use_settings: UseSettings) -> None:
    chat.script("masked", Turn(content="x"))
    async with fake_resources(verify="masked") as fake:
        out = await episode(use_settings, chat, fake.url, "masked")
    assert masked(out) == (True, 0.0, "judge_failed")
    assert out["nemogym"]["failure_reason"] == "judge down"


@pytest.mark.parametrize("code", [404, 422, 500, 503])
async def test_tool_error_status_is_model_visible_text(
    chat: ScriptedChat, use_settings: UseSettings, code: int
) -> None:
    name = f"status{code}"
    chat.script(name, Turn(tool_calls=(tool("status", code=code),)), Turn(content="ok"))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, name)
    assert masked(out) == (False, 1.0, None)
    assert chat.requests(name)[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": f"call_{name}_0_0",
        "content": f"tool failed with {code}",
    }


async def test_unparseable_arguments_are_answered_to_the_model_without_calling_the_tool(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    chat.script("badargs", Turn(tool_calls=(("echo", '{"a": 1'),)), Turn(content="ok"))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "badargs")
    assert fake.tool_calls == [] and out["reward"] == 1.0
    content = chat.requests("badargs")[1]["messages"][-1]["content"]
    assert json.loads(content)["error"].startswith("Invalid tool call arguments: JSONDecodeError(")


async def test_max_steps_ends_the_episode_and_verifies(chat: ScriptedChat, use_settings: UseSettings) -> None:
    chat.script("loop", Turn(tool_calls=(tool("echo"),)))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "loop", max_steps=3)
    record = out["nemogym"]
    assert (record["turns"], record["tool_calls"], out["reward"]) == (3, 3, 1.0)
    # Stopped by max_steps: the third turn's tool call ran, and no fourth turn was asked for.
    assert len(chat.requests("loop")) == 3 and len(fake.tool_calls) == 3
    assert len(fake.verified) == 1 and fake.verified[0]["response"]["status"] == "completed"


async def test_length_cut_off_runs_no_tool_and_verifies_an_incomplete_response(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    chat.script("cut", Turn(content="<think>long", tool_calls=(tool("echo"),), finish_reason="length"))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "cut")
    assert (out["nemogym"]["tool_calls"], out["nemogym"]["mask_sample"]) == (0, False)
    assert fake.tool_calls == []
    response = fake.verified[0]["response"]
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_huge_tool_output_is_capped_with_a_note(chat: ScriptedChat, use_settings: UseSettings) -> None:
    chat.script("huge", Turn(tool_calls=(tool("huge", size=1_000_000),)), Turn(content="ok"))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "huge")
    assert out["reward"] == 1.0
    seen = chat.requests("huge")[1]["messages"][-1]["content"]
    assert seen.startswith("x" * TOOL_OUTPUT_CAP) and "x" * (TOOL_OUTPUT_CAP + 1) not in seen
    assert f"truncated to its first {TOOL_OUTPUT_CAP} bytes of at least 1000000" in seen


async def test_concurrent_episodes_never_share_cookies(chat: ScriptedChat, use_settings: UseSettings) -> None:
    n = 50
    for i in range(n):
        chat.script(
            f"iso{i}", Turn(tool_calls=(tool("echo", i=i),)), Turn(tool_calls=(tool("echo", i=i),)), Turn(content="ok")
        )
    async with fake_resources(delay=0.01) as fake:
        envs(use_settings, **{ENV: fake.url})
        outs = await asyncio.gather(
            *(run_env(chat, env_row(ENV, f"iso{i}", task=str(i), episode=i), session=str(i)) for i in range(n))
        )
    assert [out["reward"] for out in outs] == [1.0] * n
    assert len(fake.tool_calls) == 2 * n
    for session, _, arguments in fake.tool_calls:
        assert session is not None and fake.seeded[session]["episode"] == arguments["i"]
    # The verify call carries the episode's own cookie too (the server pops its state by it).
    assert sorted(v["episode"] for v in fake.verified) == list(range(n))
    for session, body in zip(fake.verify_sessions, fake.verified, strict=True):
        assert session is not None and fake.seeded[session]["episode"] == body["episode"]


@pytest.mark.parametrize(
    "turn", [Turn(status=500), Turn(status=400), Turn(raw=b"not json"), Turn(raw=b'{"choices": []}')]
)
async def test_policy_failing_or_garbage_is_masked(chat: ScriptedChat, use_settings: UseSettings, turn: Turn) -> None:
    chat.script("policy", turn)
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "policy")
    assert masked(out) == (True, 0.0, POLICY_FAILED)
    assert fake.verified == []


async def test_resources_server_dropping_a_tool_call_is_masked_not_scored(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    chat.script("drops", Turn(tool_calls=(tool("drop"),)), Turn(content="ok"))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "drops")
    assert masked(out) == (True, 0.0, TRANSPORT_PEER_DROP)
    assert fake.verified == [] and out["nemogym"]["turns"] == 1 and out["nemogym"]["attempts"] == 1


async def test_a_row_without_responses_create_params_sends_nothing(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    async with fake_resources() as fake:
        envs(use_settings, **{ENV: fake.url})
        out = await run_env(chat, {"question": "q", "nemogym_env": ENV, "nemogym_task_id": "t/1"})
    assert masked(out) == (True, 0.0, INVALID_REQUEST)
    assert "responses_create_params" in out["nemogym"]["failure_reason"] and fake.received == []


async def test_a_reasoning_only_last_turn_is_verified_as_incomplete(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    chat.script("thinks", Turn(content="<think>only thoughts</think>"))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "thinks")
    assert out["nemogym"]["mask_sample"] is False and len(chat.requests("thinks")) == 1
    response = fake.verified[0]["response"]
    assert [i["type"] for i in response["output"]] == ["reasoning"]
    assert response["status"] == "incomplete"
    assert response["metadata"] == {"ng_termination_reason": "incomplete_reasoning"}


async def test_a_full_context_is_a_length_cut_off_not_a_failure(chat: ScriptedChat, use_settings: UseSettings) -> None:
    full = b'{"object": "error", "message": "This model\'s maximum context length is 32768 tokens.", "code": 400}'
    chat.script("full", Turn(tool_calls=(tool("echo"),)), Turn(status=400, raw=full))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "full")
    assert (*masked(out), out["nemogym"]["tool_calls"]) == (False, 1.0, None, 1)
    response = fake.verified[0]["response"]
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][-1]["content"][0]["text"] == ""  # the empty turn vllm_model makes of it


async def test_a_generation_aborted_by_miles_is_cancelled_not_scored(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    chat.script("aborted", Turn(content="", finish_reason="abort"))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "aborted")
    assert masked(out) == (True, 0.0, CANCELLED)
    assert fake.verified == []
    tally = current().ledger.drain()  # our abort: neither an episode nor a failure
    assert (tally.cancelled, tally.episodes, dict(tally.failures)) == (1, 0, {})


async def test_a_row_that_is_not_json_is_an_invalid_request(chat: ScriptedChat, use_settings: UseSettings) -> None:
    chat.script("notjson", Turn(content="x"))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "notjson", when=object())
    assert masked(out) == (True, 0.0, INVALID_REQUEST)
    assert fake.received == [] and chat.requests("notjson") == []


async def test_a_defect_is_recorded_as_a_client_error_not_raised(
    chat: ScriptedChat, monkeypatch: pytest.MonkeyPatch, use_settings: UseSettings
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(environment._Transcript, "response", broken)
    chat.script("defect", Turn(content="x"))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "defect")
    assert masked(out) == (True, 0.0, CLIENT_ERROR)
    assert "KeyError" in out["nemogym"]["failure_reason"]


def _parsed_reasoning_turn(index: int, reasoning: str, content: str, *calls: tuple[str, str]) -> Turn:
    """A turn as SGLang answers it under a ``--reasoning-parser`` (what Miles' launcher sets for
    Qwen3 and the other families): the thinking in ``message.reasoning_content``, not in ``content``."""
    message: dict[str, object] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{index}_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ]
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
    return Turn(raw=json.dumps({"model": "scripted", "choices": [choice]}).encode())


async def test_reasoning_the_policy_returns_apart_is_verified_and_replayed(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    # NeMo-Gym 0.7.0's vllm_model (uses_reasoning_parser: true in configs/vllm_model.yaml) reads a
    # message's reasoning_content (or reasoning) and wraps it in <think> before the converter makes
    # a reasoning item of it (responses_api_models/vllm_model/app.py:1037-1050); simple_agent then
    # ends on a reasoning-only turn as incomplete_reasoning (responses_api_agents/simple_agent/app.py:228-245).
    # The history goes back with that reasoning (app.py:681-690, uses_interleaved_reasoning), and
    # Miles' session matcher compares reasoning_content (message_matcher_hub: _TEMPLATE_RELEVANT_KEYS).
    chat.script(
        "parsed",
        _parsed_reasoning_turn(0, "plan A", "", tool("echo", a=1)),
        _parsed_reasoning_turn(1, "plan B", "\\boxed{B}"),
    )
    chat.script("parsed_only", _parsed_reasoning_turn(0, "still thinking", ""))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "parsed")
        only = await episode(use_settings, chat, fake.url, "parsed_only")
    assert (out["reward"], out["nemogym"]["tool_calls"]) == (1.0, 1)
    replayed = chat.requests("parsed")[1]["messages"][-2]
    assert replayed["role"] == "assistant" and replayed["reasoning_content"] == "plan A"
    output = fake.verified[0]["response"]["output"]
    assert [i["type"] for i in output] == ["reasoning", "function_call", "function_call_output", "reasoning", "message"]
    assert [i["summary"][0]["text"] for i in output if i["type"] == "reasoning"] == ["plan A", "plan B"]
    assert output[-1]["content"][0]["text"] == "\\boxed{B}"
    assert only["nemogym"]["mask_sample"] is False
    response = fake.verified[1]["response"]
    assert [i["type"] for i in response["output"]] == ["reasoning"]
    assert response["status"] == "incomplete"
    assert response["metadata"] == {"ng_termination_reason": "incomplete_reasoning"}


async def test_non_finite_numbers_in_tool_arguments_reach_the_tool_as_null(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    # simple_agent parses the arguments with json.loads, which reads NaN and Infinity, and posts
    # them with nemo_gym.server_utils.request, whose orjson.dumps writes a non-finite float as null
    # (responses_api_agents/simple_agent/app.py:264 and :273-280; nemo_gym/server_utils.py:465-466).
    chat.script(
        "nan", Turn(tool_calls=(("echo", '{"a": NaN, "b": [Infinity, -Infinity], "c": 1.5}'),)), Turn(content="ok")
    )
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "nan")
    assert out["reward"] == 1.0
    ((_, name, arguments),) = fake.tool_calls
    assert (name, arguments) == ("echo", {"a": None, "b": [None, None], "c": 1.5})
