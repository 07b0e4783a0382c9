"""The recording policy: Miles' session URL shape, per-session records, scripted answers.

Against the real loopback server with an aiohttp client. The request bodies are the
shape mini-swe-agent 2.1.0 sends through litellm (docs/upstream.md, "What an episode
does"): model, messages, ``tools=[bash]``, ``parallel_tool_calls``, sampling params.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from miles_nemogym.smoke._policy import (
    FINAL_ANSWER,
    SCRIPTED_PATCH,
    SUBMIT_MARKER,
    Answer,
    RecordingPolicy,
)
from tests.support.eventually import eventually
from tests.support.held_policy import HeldPolicy
from tests.support.mini_swe_agent import BASH_TOOL
from tests.support.policy_sessions import asked_sessions


def harness_body(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "policy",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Fix it"},
        ],
        "tools": [BASH_TOOL],
        "parallel_tool_calls": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 256,
    }
    body.update(extra)
    return body


async def chat(
    client: aiohttp.ClientSession, session_url: str, body: dict[str, Any], key: str | None = "sk-test"
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with client.post(f"{session_url}/v1/chat/completions", json=body, headers=headers) as response:
        return response.status, await response.json()


def command_of(answer: dict[str, Any]) -> str:
    call = answer["choices"][0]["message"]["tool_calls"][0]
    assert call["type"] == "function"
    assert call["function"]["name"] == "bash"
    command: str = json.loads(call["function"]["arguments"])["command"]
    return command


async def test_answers_are_openai_tool_calls_with_usage() -> None:
    async with RecordingPolicy(look_around_turns=1) as policy, aiohttp.ClientSession() as client:
        status, answer = await chat(client, policy.session_url("s1"), harness_body())
    assert status == 200
    assert answer["object"] == "chat.completion"
    assert answer["model"] == "policy"
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["tool_calls"][0]["id"].startswith("call_")
    usage = answer["usage"]
    message = choice["message"]
    # Its documented estimate: 4 characters of JSON (or text) a token.
    assert usage["prompt_tokens"] == len(json.dumps(harness_body()["messages"])) // 4
    completion = len(message["content"]) // 4 + len(json.dumps(message["tool_calls"][0]["function"])) // 4
    assert usage["completion_tokens"] == completion
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def _episode_commands(turns: int) -> list[str]:
    async with RecordingPolicy(look_around_turns=2) as policy, aiohttp.ClientSession() as client:
        url = policy.session_url("episode")
        return [command_of((await chat(client, url, harness_body()))[1]) for _ in range(turns)]


def test_script_looks_around_then_submits_a_patch_that_applies(tmp_path: Path) -> None:
    commands = asyncio.run(_episode_commands(3))
    assert SUBMIT_MARKER not in commands[0]
    assert SUBMIT_MARKER not in commands[1]
    # The submission is what mini-swe-agent takes: output after the marker line, exit 0.
    done = subprocess.run(["bash", "-c", commands[2]], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0
    first, _, patch = done.stdout.partition("\n")
    assert first == SUBMIT_MARKER
    assert patch == SCRIPTED_PATCH
    git = shutil.which("git")
    assert git, "git is needed to check that the scripted patch applies"
    subprocess.run([git, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "patch.diff").write_text(patch)
    applied = subprocess.run([git, "apply", "--check", "patch.diff"], cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr


async def test_each_session_records_only_its_own_requests() -> None:
    async with RecordingPolicy(look_around_turns=5) as policy, aiohttp.ClientSession() as client:
        a, b = policy.session_url("a"), policy.session_url("b")
        await asyncio.gather(
            chat(client, a, harness_body(seed=1)),
            chat(client, b, harness_body(seed=2)),
            chat(client, a, harness_body(seed=1)),
        )
        assert [r.body["seed"] for r in policy.chat_requests("a")] == [1, 1]
        assert [r.body["seed"] for r in policy.chat_requests("b")] == [2]
        assert {r.path for r in policy.requests("a")} == {"/sessions/a/v1/chat/completions"}
        assert sorted(asked_sessions(policy)) == ["a", "b"]
        # Turn counting is per session: b's first answer is a first-turn answer.
        assert command_of((await chat(client, b, harness_body()))[1]) == policy.default_script.command_for_turn(1)


async def test_headers_body_and_authorization_are_recorded() -> None:
    async with RecordingPolicy() as policy, aiohttp.ClientSession() as client:
        await chat(client, policy.session_url("auth"), harness_body(extra_key="x"), key="sk-secret-42")
        await chat(client, policy.session_url("noauth"), harness_body(), key=None)
    (with_key,) = policy.requests("auth")
    assert with_key.authorization == "Bearer sk-secret-42"
    assert "sk-secret-42" not in repr(with_key)
    assert "Authorization" not in with_key.headers
    assert with_key.headers["Content-Type"].startswith("application/json")
    assert with_key.body["extra_key"] == "x"
    assert with_key.body["tools"] == [BASH_TOOL]
    (without_key,) = policy.requests("noauth")
    assert without_key.authorization is None


async def test_tool_name_and_argument_follow_the_request() -> None:
    tool = {
        "type": "function",
        "function": {"name": "shell", "parameters": {"properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
    }
    async with RecordingPolicy(look_around_turns=1) as policy, aiohttp.ClientSession() as client:
        _, answer = await chat(client, policy.session_url(), harness_body(tools=[tool]))
    function = answer["choices"][0]["message"]["tool_calls"][0]["function"]
    assert function["name"] == "shell"
    assert json.loads(function["arguments"]) == {"cmd": policy.default_script.command_for_turn(0)}


async def test_wrong_paths_and_bodies_are_refused_and_recorded() -> None:
    async with RecordingPolicy() as policy, aiohttp.ClientSession() as client:
        async with client.post(f"{policy.url}/v1/chat/completions", json=harness_body()) as response:
            assert response.status == 404  # no session in the path: not Miles' URL shape
        async with client.get(f"{policy.session_url('s')}/v1/models") as response:
            assert response.status == 404
        async with client.post(f"{policy.session_url('s')}/v1/chat/completions", data=b"not json") as response:
            assert response.status == 400
        status, answer = await chat(client, policy.session_url("s"), harness_body(stream=True))
        assert status == 400
        assert "stream" in answer["error"]["message"]
    paths = [(r.session_id, r.method, r.path) for r in policy.requests()]
    assert paths == [
        (None, "POST", "/v1/chat/completions"),
        ("s", "GET", "/sessions/s/v1/models"),
        ("s", "POST", "/sessions/s/v1/chat/completions"),
        ("s", "POST", "/sessions/s/v1/chat/completions"),
    ]
    assert policy.requests("s")[1].body == "not json"


async def test_a_session_given_answers_plays_them_then_the_final_answer() -> None:
    turns = (Answer(content="\\boxed{B}"), Answer(content="t", tool_calls=(("echo", {"a": 1}),)))
    async with RecordingPolicy() as policy, aiohttp.ClientSession() as client:
        policy.configure_session("env", answers=turns)
        said = [(await chat(client, policy.session_url("env"), harness_body()))[1] for _ in range(3)]
        _, other = await chat(client, policy.session_url("swe"), harness_body())
    messages = [answer["choices"][0]["message"] for answer in said]
    assert [m["content"] for m in messages] == ["\\boxed{B}", "t", FINAL_ANSWER.content]
    assert "tool_calls" not in messages[0] and "tool_calls" not in messages[2]
    (call,) = messages[1]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("echo", {"a": 1})
    assert [answer["choices"][0]["finish_reason"] for answer in said] == ["stop", "tool_calls", "stop"]
    assert command_of(other) == "pwd"  # another session still runs the bash script


async def test_a_held_session_waits_until_released_others_do_not() -> None:
    async with HeldPolicy() as policy, aiohttp.ClientSession() as client:
        policy.hold_session("slow")
        held = asyncio.create_task(chat(client, policy.session_url("slow"), harness_body()))
        await eventually(lambda: policy.arrivals("slow"), "the held request arrived")
        status, _ = await chat(client, policy.session_url("fast"), harness_body())
        assert status == 200  # answered after the held request arrived
        assert not held.done()
        policy.release()
        status, answer = await asyncio.wait_for(held, timeout=10)
    assert status == 200
    assert command_of(answer)


async def test_stopping_releases_held_answers() -> None:
    policy = HeldPolicy(hold_all=True)
    await policy.start()
    client = aiohttp.ClientSession()
    try:
        held = asyncio.create_task(chat(client, policy.session_url(), harness_body()))
        await eventually(policy.arrivals, "the held request arrived")
        await asyncio.wait_for(policy.stop(), timeout=10)
        status, _ = await asyncio.wait_for(held, timeout=10)
        assert status == 200
    finally:
        await client.close()


def test_runs_in_a_thread_for_sync_callers() -> None:
    with RecordingPolicy(look_around_turns=0) as policy:
        request = urllib.request.Request(
            f"{policy.session_url('sync')}/v1/chat/completions",
            data=json.dumps(harness_body()).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.load(response)
        assert SUBMIT_MARKER in command_of(answer)
        assert len(policy.chat_requests("sync")) == 1
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{policy.url}/sessions/x/v1/chat/completions", timeout=2)


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="look_around_turns"):
        RecordingPolicy(look_around_turns=-1)


def test_session_id_round_trips_through_the_url() -> None:
    with RecordingPolicy() as policy:
        url = policy.session_url("abc123")
        assert url == f"{policy.url}/sessions/abc123"
        assert RecordingPolicy.session_id_of(url) == "abc123"
        assert RecordingPolicy.session_id_of(url + "/v1") == "abc123"
        assert policy.session_url() != policy.session_url()
