"""The ``simple_agent``-style loop against loopback servers: stop rules, tool errors,
caps, cookies and every infrastructure failure (masked under its kind, never a reward)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from miles_nemogym import failure_kinds as fk
from miles_nemogym.simple_agent import Connections, EpisodeResult, Limits, run_episode
from tests.support.fake_resources import FakeResources, fake_resources, row
from tests.support.ports import free_port
from tests.support.scripted_chat import ScriptedChat, Turn, tag, tool
from tests.support.tls import make_certificates


@pytest.fixture(scope="module")
def chat() -> Iterator[ScriptedChat]:
    with ScriptedChat() as policy:
        yield policy


async def _run(
    chat: ScriptedChat, fake: FakeResources | str, name: str, limits: Limits | None = None, **fields: object
) -> EpisodeResult:
    url = fake if isinstance(fake, str) else fake.url
    return await run_episode(
        row(tag(name), **fields), session_url=chat.session_url(name), resources_url=url, limits=limits
    )


async def test_a_gold_episode_seeds_calls_tools_and_verifies(chat: ScriptedChat) -> None:
    chat.script("ok", Turn(content="<think>t</think>", tool_calls=(tool("echo", a=1),)), Turn(content="done"))
    async with fake_resources(delay=0.02) as fake:
        result = await _run(chat, fake, "ok")
    assert (result.reward, result.mask_sample, result.stop) == (1.0, False, "no_tool_call")
    assert (result.turns, result.tool_calls) == (2, 1)
    assert result.total_tool_time >= 3 * 0.02  # seed + one tool + verify
    ((session, name, arguments),) = fake.tool_calls
    assert (name, arguments) == ("echo", {"a": 1}) and session in fake.seeded
    output = fake.verified[0]["response"]["output"]
    assert [i["type"] for i in output] == ["reasoning", "function_call", "function_call_output", "message"]
    assert output[0]["summary"] == [{"type": "summary_text", "text": "t"}]
    assert output[-1]["content"][0]["text"] == "done"


async def test_resources_server_down_is_masked_before_any_model_call(chat: ScriptedChat) -> None:
    chat.script("down", Turn(content="x"))
    result = await _run(chat, f"http://127.0.0.1:{free_port()}", "down")
    assert (result.mask_sample, result.reward, result.failure_kind) == (True, None, fk.TRANSPORT_UNREACHABLE)
    assert result.undelivered  # nothing reached any server: the caller may run it again
    assert chat.requests("down") == []


async def test_an_untrusted_resources_certificate_is_transport_tls_and_undelivered(
    chat: ScriptedChat, tmp_path: Path
) -> None:
    chat.script("tls", Turn(content="x"))
    async with fake_resources(tls=make_certificates(tmp_path).server_context()) as fake:
        result = await _run(chat, fake, "tls")
    assert (result.mask_sample, result.failure_kind, result.undelivered) == (True, fk.TRANSPORT_TLS, True)
    assert fake.seeded == {} and chat.requests("tls") == []


@pytest.mark.parametrize("mode", ["500", "garbage"])
async def test_seed_failing_or_garbage_is_masked(chat: ScriptedChat, mode: str) -> None:
    chat.script(f"seed{mode}", Turn(content="x"))
    async with fake_resources(seed=mode) as fake:
        result = await _run(chat, fake, f"seed{mode}")
    assert (result.mask_sample, result.reward, result.failure_kind) == (True, None, fk.SEED_FAILED)
    assert chat.requests(f"seed{mode}") == [] and fake.verified == []


@pytest.mark.parametrize("mode", ["500", "garbage", "no_reward"])
async def test_verify_failing_or_garbage_is_masked(chat: ScriptedChat, mode: str) -> None:
    chat.script(f"verify{mode}", Turn(content="x"))
    async with fake_resources(verify=mode) as fake:
        result = await _run(chat, fake, f"verify{mode}")
    assert (result.mask_sample, result.reward, result.failure_kind) == (True, None, fk.VERIFIER_ERROR)
    assert result.turns == 1


async def test_verify_masking_the_sample_keeps_its_kind(chat: ScriptedChat) -> None:
    chat.script("masked", Turn(content="x"))
    async with fake_resources(verify="masked") as fake:
        result = await _run(chat, fake, "masked")
    assert (result.mask_sample, result.reward, result.failure_kind) == (True, None, "judge_failed")
    assert result.failure_reason == "judge down"


@pytest.mark.parametrize("code", [404, 422, 500, 503])
async def test_tool_error_status_is_model_visible_text(chat: ScriptedChat, code: int) -> None:
    name = f"status{code}"
    chat.script(name, Turn(tool_calls=(tool("status", code=code),)), Turn(content="ok"))
    async with fake_resources() as fake:
        result = await _run(chat, fake, name)
    assert (result.reward, result.mask_sample) == (1.0, False)
    assert chat.requests(name)[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": f"call_{name}_0_0",
        "content": f"tool failed with {code}",
    }


async def test_unparseable_arguments_are_answered_to_the_model_without_calling_the_tool(chat: ScriptedChat) -> None:
    chat.script("badargs", Turn(tool_calls=(("echo", '{"a": 1'),)), Turn(content="ok"))
    async with fake_resources() as fake:
        result = await _run(chat, fake, "badargs")
    assert fake.tool_calls == [] and result.reward == 1.0
    content = chat.requests("badargs")[1]["messages"][-1]["content"]
    assert json.loads(content)["error"].startswith("Invalid tool call arguments: JSONDecodeError(")


async def test_max_steps_ends_the_episode_and_verifies(chat: ScriptedChat) -> None:
    chat.script("loop", Turn(tool_calls=(tool("echo"),)))
    async with fake_resources() as fake:
        result = await _run(chat, fake, "loop", Limits(max_steps=3))
    assert (result.stop, result.turns, result.tool_calls, result.reward) == ("max_steps", 3, 3, 1.0)
    assert len(fake.verified) == 1


async def test_length_cut_off_runs_no_tool_and_verifies_an_incomplete_response(chat: ScriptedChat) -> None:
    chat.script("cut", Turn(content="<think>long", tool_calls=(tool("echo"),), finish_reason="length"))
    async with fake_resources() as fake:
        result = await _run(chat, fake, "cut")
    assert (result.stop, result.tool_calls, result.mask_sample) == ("length", 0, False)
    assert fake.tool_calls == []
    response = fake.verified[0]["response"]
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_huge_tool_output_is_capped_with_a_note(chat: ScriptedChat) -> None:
    chat.script("huge", Turn(tool_calls=(tool("huge", size=1_000_000),)), Turn(content="ok"))
    async with fake_resources() as fake:
        result = await _run(chat, fake, "huge", Limits(max_tool_output_bytes=1000))
    assert result.reward == 1.0
    seen = chat.requests("huge")[1]["messages"][-1]["content"]
    assert seen.startswith("x" * 1000) and "x" * 1001 not in seen
    assert "truncated to its first 1000 bytes of 1000000 bytes" in seen


async def test_concurrent_episodes_never_share_cookies(chat: ScriptedChat) -> None:
    n = 20
    for i in range(n):
        chat.script(
            f"iso{i}", Turn(tool_calls=(tool("echo", i=i),)), Turn(tool_calls=(tool("echo", i=i),)), Turn(content="ok")
        )
    async with fake_resources(delay=0.01) as fake, Connections() as connections:
        results = await asyncio.gather(
            *(
                run_episode(
                    row(tag(f"iso{i}"), episode=i),
                    session_url=chat.session_url(str(i)),
                    resources_url=fake.url,
                    connections=connections,
                )
                for i in range(n)
            )
        )
    assert all(r.reward == 1.0 for r in results)
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
async def test_policy_failing_or_garbage_is_masked(chat: ScriptedChat, turn: Turn) -> None:
    chat.script("policy", turn)
    async with fake_resources() as fake:
        result = await _run(chat, fake, "policy")
    assert (result.mask_sample, result.reward, result.failure_kind) == (True, None, fk.POLICY_FAILED)
    assert fake.verified == []


async def test_resources_server_dropping_a_tool_call_is_masked_not_scored(chat: ScriptedChat) -> None:
    chat.script("drops", Turn(tool_calls=(tool("drop"),)), Turn(content="ok"))
    async with fake_resources() as fake:
        result = await _run(chat, fake, "drops")
    assert (result.mask_sample, result.reward, result.failure_kind) == (True, None, fk.TRANSPORT_PEER_DROP)
    assert fake.verified == [] and result.turns == 1


async def test_a_row_without_responses_create_params_sends_nothing(chat: ScriptedChat) -> None:
    async with fake_resources() as fake:
        result = await run_episode({"question": "q"}, session_url=chat.session_url(), resources_url=fake.url)
    assert (result.mask_sample, result.failure_kind) == (True, fk.INVALID_REQUEST)
    assert "responses_create_params" in (result.failure_reason or "") and fake.seeded == {}


async def test_a_reasoning_only_last_turn_is_verified_as_incomplete(chat: ScriptedChat) -> None:
    chat.script("thinks", Turn(content="<think>only thoughts</think>"))
    async with fake_resources() as fake:
        result = await _run(chat, fake, "thinks")
    assert (result.stop, result.mask_sample) == ("no_tool_call", False)
    response = fake.verified[0]["response"]
    assert [i["type"] for i in response["output"]] == ["reasoning"]
    assert response["status"] == "incomplete"
    assert response["metadata"] == {"ng_termination_reason": "incomplete_reasoning"}


async def test_a_full_context_is_a_length_cut_off_not_a_failure(chat: ScriptedChat) -> None:
    full = b'{"object": "error", "message": "This model\'s maximum context length is 32768 tokens.", "code": 400}'
    chat.script("full", Turn(tool_calls=(tool("echo"),)), Turn(status=400, raw=full))
    async with fake_resources() as fake:
        result = await _run(chat, fake, "full")
    assert (result.stop, result.mask_sample, result.reward, result.tool_calls) == ("length", False, 1.0, 1)
    response = fake.verified[0]["response"]
    assert response["status"] == "incomplete"
    assert response["output"][-1]["content"][0]["text"] == ""  # the empty turn vllm_model makes of it


async def test_a_generation_aborted_by_miles_is_cancelled_not_scored(chat: ScriptedChat) -> None:
    chat.script("aborted", Turn(content="", finish_reason="abort"))
    async with fake_resources() as fake:
        result = await _run(chat, fake, "aborted")
    assert (result.mask_sample, result.reward, result.failure_kind) == (True, None, fk.CANCELLED)
    assert fake.verified == []


async def test_a_row_that_is_not_json_is_an_invalid_request(chat: ScriptedChat) -> None:
    chat.script("notjson", Turn(content="x"))
    async with fake_resources() as fake:
        result = await _run(chat, fake, "notjson", when=object())
    assert (result.mask_sample, result.failure_kind) == (True, fk.INVALID_REQUEST)
    assert fake.seeded == {}


async def test_a_defect_is_recorded_as_a_client_error_not_raised(
    chat: ScriptedChat, monkeypatch: pytest.MonkeyPatch
) -> None:
    from miles_nemogym.simple_agent import transcript

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(transcript.Transcript, "response", broken)
    chat.script("defect", Turn(content="x"))
    async with fake_resources() as fake:
        result = await _run(chat, fake, "defect")
    assert (result.mask_sample, result.reward, result.failure_kind) == (True, None, fk.CLIENT_ERROR)
    assert "KeyError" in (result.failure_reason or "")
