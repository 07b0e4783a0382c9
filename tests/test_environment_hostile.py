"""The environment path against hostile or careless servers, settings and rows, through its
public surfaces (``agent.run``, ``agent.reward_func``, the CLI): redirects, a policy that never
answers, passwords in URLs, loose rewards, a look-alike context error, bad ``NEMO_GYM_ENVS``,
a failed episode's transcript, an echoed key, reserved endpoints as tools, size and concurrency
caps, NaN, terminal escapes, JSON nested past any parser's depth, a gzip bomb.

Each test is one protection; it fails if that protection is removed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from typer.testing import CliRunner

from miles_nemogym import agent
from miles_nemogym.cli.main import app
from miles_nemogym.errors import (
    AGENT_TIMEOUT,
    INVALID_CONFIG,
    POLICY_FAILED,
    POLICY_TIMEOUT,
    SEED_FAILED,
    TRANSPORT_UNREACHABLE,
    VERIFIER_ERROR,
    SettingsError,
)
from miles_nemogym.settings import Settings
from miles_nemogym.store import _reader as reader
from tests.support.agent_fixtures import fast_env
from tests.support.clean_env import UNSET
from tests.support.environment_episodes import (
    ENV,
    chat,
    env_row,
    envs,
    episode,
    flush_store,
    masked,
    run_env,
    store_lines,
    strict_json_problem,
    strict_line_problem,
    within,
)
from tests.support.fake_resources import fake_resources
from tests.support.gzip_bomb import gzip_bomb
from tests.support.ports import free_port
from tests.support.runtime_settings import UseSettings
from tests.support.samples import Sample
from tests.support.scripted_chat import ScriptedChat, Turn, tool

__all__ = ["chat", "fast_env"]  # fixtures used by name
pytestmark = pytest.mark.usefixtures("fast_env")

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def raw(body: bytes, **headers: str) -> Callable[[Any], web.Response]:
    """An endpoint answering ``body`` as JSON, whatever it was sent."""
    return lambda _: web.Response(body=body, headers={"Content-Type": "application/json", **headers})


def redirect(status: int, location: str) -> Callable[[Any], web.Response]:
    return lambda _: web.Response(status=status, headers={"Location": location})


# --- 1. redirects are answers, never followed ------------------------------------------------


@pytest.mark.parametrize(
    ("where", "status", "kind"),
    [
        ("seed_session", 307, SEED_FAILED),
        ("verify", 307, VERIFIER_ERROR),
        ("verify", 302, VERIFIER_ERROR),  # followed, it became a GET the other server answered 1.0
    ],
)
async def test_a_redirect_from_the_resources_server_sends_nothing_elsewhere(
    chat: ScriptedChat, use_settings: UseSettings, where: str, status: int, kind: str
) -> None:
    chat.script(f"moved{where}{status}", Turn(content="x"))
    async with fake_resources() as other, fake_resources() as fake:
        fake.respond[where] = redirect(status, f"{other.url}/{where}")
        out = await episode(use_settings, chat, fake.url, f"moved{where}{status}")
    assert other.received == []  # neither the row (and its expected_answer) nor the session cookie
    assert masked(out) == (True, 0.0, kind)
    assert "not followed" in out["nemogym"]["failure_reason"]


async def test_a_tools_redirect_is_its_output_to_the_model_and_sends_nothing_elsewhere(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    async with fake_resources() as other, fake_resources() as fake:
        chat.script("movedtool", Turn(tool_calls=(tool("moved", to=f"{other.url}/echo"),)), Turn(content="done"))
        out = await episode(use_settings, chat, fake.url, "movedtool")
    assert other.received == []
    assert [name for _, name, _ in fake.tool_calls] == ["moved"]
    assert chat.requests("movedtool")[1]["messages"][-1]["content"] == "moved"  # the 307's own body
    assert masked(out) == (False, 1.0, None)


# --- 2. one deadline for the whole episode -----------------------------------------------------


@pytest.mark.parametrize(("deadline", "delay"), [(1, 3600), (2, 8)], ids=["never-answers", "slower-than-deadline"])
async def test_a_policy_slower_than_the_deadline_ends_the_episode_at_the_deadline(
    chat: ScriptedChat, use_settings: UseSettings, deadline: int, delay: int
) -> None:
    use_settings(NEMO_GYM_RUN_TIMEOUT=str(deadline))
    chat.script(f"slow{delay}", Turn(content="x", delay_s=delay))
    async with fake_resources() as fake:
        out, took = await within(deadline + 2, episode(use_settings, chat, fake.url, f"slow{delay}"))
    assert masked(out) == (True, 0.0, AGENT_TIMEOUT)
    assert took >= deadline - 0.1 and out["nemogym"]["elapsed_s"] < deadline + 2
    assert "NEMO_GYM_RUN_TIMEOUT" in out["nemogym"]["failure_reason"]
    assert fake.verified == []


async def test_endless_tool_calls_without_max_steps_end_at_the_deadline(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_RUN_TIMEOUT="1")
    chat.script("endless", Turn(tool_calls=(tool("echo"),), delay_s=0.05))  # 100 turns would take 5 s
    async with fake_resources() as fake:
        out, _ = await within(3, episode(use_settings, chat, fake.url, "endless"))
    # The policy ran out the clock: scored its lowest reward (0 here) and trained, not set aside.
    assert masked(out) == (False, 0.0, POLICY_TIMEOUT)
    assert len(fake.tool_calls) > 1 and fake.verified == []


# --- 5. a URL's password ---------------------------------------------------------------------

PASSWORD = "hunter2-pw-9f3c"


async def test_a_url_password_never_reaches_a_log_line_or_the_record(
    chat: ScriptedChat, use_settings: UseSettings, caplog: pytest.LogCaptureFixture
) -> None:
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="1")
    chat.script("password", Turn(content="x"))
    with caplog.at_level(logging.DEBUG):
        out, _ = await within(
            10, episode(use_settings, chat, f"http://user:{PASSWORD}@127.0.0.1:{free_port()}", "password")
        )
    assert masked(out) == (True, 0.0, TRANSPORT_UNREACHABLE)
    assert "cannot be reached" in caplog.text  # the outage line was logged
    assert PASSWORD not in caplog.text
    assert PASSWORD not in json.dumps(out)


CUT_KEY = "sk-MARKER-0123456789abcdef0123456789abcdefGHIJ"
"""A policy key; a server below echoes it where a quote, a cut or pydantic's shortening would split it."""
PADDED = "\u00e9" * 130 + " key=" + CUT_KEY
"""260 bytes of two-byte characters first: a cut at 300 bytes ends inside the key, under 300 characters."""


def fragments(text: str | bytes) -> list[str]:
    """The pieces of ``CUT_KEY`` longer than 8 characters found in ``text``."""
    found = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    return [CUT_KEY[i : i + 9] for i in range(len(CUT_KEY) - 8) if CUT_KEY[i : i + 9] in found]


def _error(status: int, text: str) -> Callable[[Any], web.Response]:
    return lambda body: web.Response(status=status, text=text)


@pytest.mark.parametrize(
    ("where", "answer"),
    [
        ("seed_session", _error(500, PADDED)),
        ("verify", _error(500, PADDED)),
        ("verify", lambda body: web.json_response(["x" * 175 + CUT_KEY])),
        ("policy", Turn(status=401, raw=PADDED.encode())),
        ("policy", Turn(raw=json.dumps({"choices": CUT_KEY * 2}).encode())),
    ],
    ids=["seed-500", "verify-500", "verify-not-an-object", "policy-401", "policy-unreadable"],
)
async def test_no_piece_of_the_key_survives_a_servers_answer_quoted_in_the_reason(
    chat: ScriptedChat, use_settings: UseSettings, caplog: pytest.LogCaptureFixture, where: str, answer: Any
) -> None:
    use_settings(NEMO_GYM_POLICY_API_KEY=CUT_KEY)
    chat.script("keyed", answer if where == "policy" else Turn(content="B"))
    async with fake_resources() as fake:
        if where != "policy":
            fake.respond[where] = answer
        with caplog.at_level(logging.WARNING):
            out, _ = await within(10, episode(use_settings, chat, fake.url, "keyed"))
    assert out["nemogym"]["mask_sample"] and out["nemogym"]["failure_reason"]
    assert fragments(json.dumps(out)) == [] and fragments(caplog.text) == []


@pytest.mark.parametrize("status", [200, 403])
async def test_a_tool_output_keeps_no_piece_of_the_key_for_the_policy_or_the_store(
    chat: ScriptedChat, use_settings: UseSettings, tmp_path: Path, status: int
) -> None:
    """A whole key (403) or one the 64 KiB cap cut in two (200) reaches neither the model nor the disk."""
    use_settings(NEMO_GYM_POLICY_API_KEY=CUT_KEY, NEMO_GYM_EPISODE_DIR=str(tmp_path))
    chat.script("toolkey", Turn(tool_calls=(tool("echo", a=1),)), Turn(content="B"))
    body = b"x" * (64 * 1024 - 20) + CUT_KEY.encode() + b"tail" if status == 200 else f"Bearer {CUT_KEY}".encode()
    async with fake_resources() as fake:
        fake.respond["echo"] = lambda arguments: web.Response(status=status, body=body)
        out, _ = await within(10, episode(use_settings, chat, fake.url, "toolkey"))
    flush_store(tmp_path)
    assert out["nemogym"]["tool_calls"] == 1
    assert fragments(json.dumps(chat.requests("toolkey"))) == []
    assert fragments(b"\n".join(store_lines(tmp_path))) == []


def test_a_url_password_in_a_bad_nemo_gym_envs_is_hidden_in_the_settings_error() -> None:
    envs = json.dumps({"mcqa": {"url": f"http://user:{PASSWORD}@gym:8001", "max_steps": "five"}})
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"NEMO_GYM_ENVS": envs})
    assert "max_steps" in str(refused.value) and PASSWORD not in str(refused.value)


# --- 6. a reward is a JSON number, mask_sample a JSON boolean ----------------------------------


@pytest.mark.parametrize(
    ("given", "extra"),
    [("1.0", {}), ("1", {}), (True, {}), (1.0, {"mask_sample": "false"}), (1.0, {"mask_sample": 0})],
    ids=["reward-str-float", "reward-str-int", "reward-true", "mask-str-false", "mask-zero"],
)
async def test_a_loosely_typed_reward_or_mask_is_a_verifier_error_not_a_reward(
    chat: ScriptedChat, use_settings: UseSettings, given: Any, extra: dict[str, Any]
) -> None:
    chat.script("loose", Turn(content="x"))
    async with fake_resources(reward=given, extra=extra) as fake:
        out = await episode(use_settings, chat, fake.url, "loose")
    assert masked(out) == (True, 0.0, VERIFIER_ERROR)
    sample = Sample(prompt=[], metadata={**env_row(ENV), **out})
    assert await agent.reward_func(None, sample) == 0.0


# --- 7. a policy 400 is a full context only when it says so -------------------------------------


async def test_a_policy_400_about_max_tokens_is_policy_failed_not_a_cut_off(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    bad = b'{"object": "error", "message": "max_tokens must be at least 1, got -1.", "code": 400}'
    chat.script("maxtokens", Turn(tool_calls=(tool("echo"),)), Turn(status=400, raw=bad))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "maxtokens")
    assert masked(out) == (True, 0.0, POLICY_FAILED)
    assert fake.verified == []


@pytest.mark.parametrize(
    "message",
    [
        "This model's maximum context length is 32768 tokens. However, you requested 33000 tokens.",  # vLLM
        "The input (40000 tokens) is longer than the model's context length (32768 tokens).",  # SGLang
    ],
    ids=["vllm", "sglang"],
)
async def test_a_policy_400_saying_the_context_is_full_is_still_a_cut_off_that_is_verified(
    chat: ScriptedChat, use_settings: UseSettings, message: str
) -> None:
    body = json.dumps({"object": "error", "message": message, "code": 400}).encode()
    chat.script("contextfull", Turn(tool_calls=(tool("echo"),)), Turn(status=400, raw=body))
    async with fake_resources() as fake:
        out = await episode(use_settings, chat, fake.url, "contextfull")
    assert masked(out) == (False, 1.0, None)
    assert fake.verified[0]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


# --- 8. NEMO_GYM_ENVS is read strictly -------------------------------------------------------

BAD_ENVS = {
    "max-steps-true": '{"fake": {"url": "URL", "max_steps": true}}',
    "max-steps-string": '{"fake": {"url": "URL", "max_steps": "5"}}',
    "max-steps-huge": '{"fake": {"url": "URL", "max_steps": 1e9}}',
    "max-steps-float": '{"fake": {"url": "URL", "max_steps": 2.0}}',
    "duplicate-key": '{"fake": "http://127.0.0.1:1", "fake": "URL"}',
    "query": '{"fake": "URL?x=1"}',
    "fragment": '{"fake": "URL#frag"}',
}


@pytest.mark.parametrize("text", BAD_ENVS.values(), ids=BAD_ENVS.keys())
async def test_a_bad_nemo_gym_envs_is_invalid_config_and_sends_nothing(
    chat: ScriptedChat, use_settings: UseSettings, text: str
) -> None:
    chat.script("badenvs", Turn(content="x"))
    async with fake_resources() as fake:
        use_settings(NEMO_GYM_ENVS=text.replace("URL", fake.url))
        out = await run_env(chat, env_row(ENV, "badenvs"))
    assert masked(out) == (True, 0.0, INVALID_CONFIG)
    assert "NEMO_GYM_ENVS" in out["nemogym"]["failure_reason"]
    assert fake.received == [] and chat.requests("badenvs") == []
    with pytest.raises(SettingsError, match="NEMO_GYM_ENVS"):
        Settings.from_env({"NEMO_GYM_ENVS": text.replace("URL", fake.url)})


@pytest.mark.parametrize("text", BAD_ENVS.values(), ids=BAD_ENVS.keys())
def test_doctor_refuses_a_bad_nemo_gym_envs(text: str) -> None:
    # doctor reads the environment, as the user's shell gives it: none of the shell's variables but these
    env = {
        **dict.fromkeys(UNSET),
        "COLUMNS": "200",
        "NEMO_GYM_URL": f"http://127.0.0.1:{free_port()}",
        "NEMO_GYM_ENVS": text.replace("URL", f"http://127.0.0.1:{free_port()}"),
    }
    result = CliRunner().invoke(app, ["doctor", "--timeout", "1"], env=env)
    assert result.exit_code == 1, result.output
    assert re.search(r"FAIL settings:.*NEMO_GYM_ENVS", result.output), result.output


# --- 9. the store keeps what the loop recorded ---------------------------------------------------


def show(directory: Path, episode_id: str) -> str:
    result = CliRunner().invoke(app, ["episodes", str(directory), "--show", episode_id])
    assert result.exit_code == 0, result.output
    return result.output


def stored_answer(directory: Path) -> Any:
    (stored,) = reader.load(directory, answers=True).episodes
    return stored.entry.get("answer")


@pytest.mark.parametrize("failing", ["verify", "policy"])
async def test_a_failed_episode_keeps_its_transcript_in_the_store(
    chat: ScriptedChat, use_settings: UseSettings, tmp_path: Path, failing: str
) -> None:
    use_settings(NEMO_GYM_EPISODE_DIR=str(tmp_path))
    last = Turn(status=500) if failing == "policy" else Turn(content="done")
    chat.script(
        f"kept{failing}", Turn(tool_calls=(tool("echo", step=1),)), Turn(tool_calls=(tool("echo", step=2),)), last
    )
    async with fake_resources(verify="500" if failing == "verify" else "ok") as fake:
        out = await episode(use_settings, chat, fake.url, f"kept{failing}")
    assert out["nemogym"]["mask_sample"] is True and out["nemogym"]["turns"] == (3 if failing == "verify" else 2)
    flush_store(tmp_path)
    shown = show(tmp_path, out["nemogym"]["episode_id"])
    assert "(no verify answer" not in shown
    assert '{"step": 2}' in shown and "--- turn 2" in shown
    answer = stored_answer(tmp_path)
    assert isinstance(answer, dict), answer
    items = [item["type"] for item in answer["response"]["output"]]
    assert items[:4] == ["function_call", "function_call_output"] * 2


async def test_a_valid_episode_shows_what_the_loop_recorded_not_the_servers_echo(
    chat: ScriptedChat, use_settings: UseSettings, tmp_path: Path
) -> None:
    use_settings(NEMO_GYM_EPISODE_DIR=str(tmp_path))
    chat.script("echoed", Turn(tool_calls=(tool("echo", step=1),)), Turn(content="the loop's own answer"))
    forged = {
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "FORGED"}]}]
    }
    async with fake_resources() as fake:
        fake.respond["verify"] = lambda body: web.json_response({**body, "response": forged, "reward": 1.0})
        out = await episode(use_settings, chat, fake.url, "echoed")
    assert masked(out) == (False, 1.0, None)
    flush_store(tmp_path)
    assert "FORGED" not in json.dumps(stored_answer(tmp_path))
    shown = show(tmp_path, out["nemogym"]["episode_id"])
    assert "the loop's own answer" in shown and "FORGED" not in shown


# --- 11. the policy's key ------------------------------------------------------------------------

KEY = "sk-live-0123456789abcdef0123456789abcdef"


async def test_a_key_echoed_by_the_verifier_never_reaches_the_returned_dict(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_POLICY_API_KEY=KEY)
    chat.script("keyed", Turn(content=f"\\boxed{{{KEY}}}"))
    async with fake_resources(extra={"extracted_answer": KEY, "judge": {"said": f"the answer is {KEY}"}}) as fake:
        out = await episode(use_settings, chat, fake.url, "keyed")
    assert masked(out) == (False, 1.0, None)
    assert set(out["eval_report"]) == {"extracted_answer", "judge"}  # the fields stay, the key does not
    assert KEY not in json.dumps(out)


# --- 12. only a row's declared tools are called --------------------------------------------------

RESERVED = ("verify", "seed_session", "aggregate_metrics", "close_session", "", ".", "..")


async def test_a_model_calling_a_reserved_endpoint_or_a_path_sends_nothing_for_it(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    chat.script("reserved", Turn(tool_calls=tuple((name, "{}") for name in RESERVED)), Turn(content="done"))
    async with fake_resources(prefix="/gym") as fake:  # under a prefix ".." would reach the parent folder
        out = await episode(use_settings, chat, f"{fake.url}/gym", "reserved")
    assert [(method, path) for method, path, _ in fake.received] == [
        ("POST", "/gym/seed_session"),
        ("POST", "/gym/verify"),
    ]
    outputs = [m["content"] for m in chat.requests("reserved")[1]["messages"] if m["role"] == "tool"]
    assert len(outputs) == len(RESERVED) and all("Unknown tool" in output for output in outputs)
    assert masked(out) == (False, 1.0, None) and out["nemogym"]["tool_calls"] == len(RESERVED)


# --- 13. NEMO_GYM_MAX_RESULT_BYTES and NEMO_GYM_MAX_CONCURRENCY apply to environments ---------------


@pytest.mark.parametrize(("where", "kind"), [("seed_session", SEED_FAILED), ("verify", VERIFIER_ERROR)])
async def test_an_answer_over_max_result_bytes_is_masked_and_nothing_big_is_returned(
    chat: ScriptedChat, use_settings: UseSettings, where: str, kind: str
) -> None:
    use_settings(NEMO_GYM_MAX_RESULT_BYTES=str(1024 * 1024))
    chat.script(f"big{where}", Turn(content="x"))
    big = json.dumps({"reward": 1.0, "blob": "x" * (4 * 1024 * 1024)}).encode()
    async with fake_resources(respond={where: raw(big)}) as fake:
        out = await episode(use_settings, chat, fake.url, f"big{where}")
    assert masked(out) == (True, 0.0, kind)
    assert "NEMO_GYM_MAX_RESULT_BYTES" in out["nemogym"]["failure_reason"]
    assert len(json.dumps(out)) < 64 * 1024


async def test_max_concurrency_bounds_the_requests_at_a_resources_server(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_MAX_CONCURRENCY="4")
    n = 50
    for i in range(n):
        chat.script(f"many{i}", Turn(tool_calls=(tool("echo", i=i),)), Turn(content="ok"))
    async with fake_resources(delay=0.05) as fake:
        envs(use_settings, **{ENV: fake.url})
        outs, _ = await within(
            60,
            asyncio.gather(*(run_env(chat, env_row(ENV, f"many{i}", task=str(i)), session=str(i)) for i in range(n))),
        )
    assert [out["reward"] for out in outs] == [1.0] * n
    assert len(fake.received) == 3 * n
    assert fake.max_in_flight == 4


# --- 14. strict JSON everywhere ------------------------------------------------------------------


async def test_nan_and_infinity_from_verify_leave_strict_json_in_the_result_and_the_store(
    chat: ScriptedChat, use_settings: UseSettings, tmp_path: Path
) -> None:
    use_settings(NEMO_GYM_EPISODE_DIR=str(tmp_path))
    chat.script("nan", Turn(content="x"))
    extra = {"score": float("nan"), "bound": float("inf"), "nested": {"low": [float("-inf")]}}
    async with fake_resources(extra=extra) as fake:
        out = await episode(use_settings, chat, fake.url, "nan")
    assert masked(out) == (False, 1.0, None)
    assert set(out["eval_report"]) == set(extra)
    assert strict_json_problem(out) is None
    flush_store(tmp_path)
    lines = store_lines(tmp_path)
    assert lines and [problem for problem in map(strict_line_problem, lines) if problem] == []


# --- 15. terminal escapes in a row's environment -------------------------------------------------


async def test_terminal_escapes_in_a_rows_environment_reach_no_log_line_or_reason(
    chat: ScriptedChat, use_settings: UseSettings, caplog: pytest.LogCaptureFixture
) -> None:
    hostile = "\x1b]0;pwned\x07\x1b[2J\x1b[31mmcqa"
    async with fake_resources() as fake:
        envs(use_settings, mcqa=fake.url)
        with caplog.at_level(logging.INFO, logger="miles_nemogym"):
            out = await run_env(chat, env_row(hostile, nemogym_task_id="t/1"))
    record = out["nemogym"]
    assert (record["mask_sample"], fake.received) == (True, [])
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert lines  # the trainer is told, once
    texts = [*lines, *(value for value in record.values() if isinstance(value, str))]
    assert [text for text in texts if CONTROL.search(text)] == []


# --- 16. JSON nested past any parser's depth ------------------------------------------------------


@pytest.mark.parametrize(("where", "kind"), [("seed_session", SEED_FAILED), ("verify", VERIFIER_ERROR)])
async def test_json_nested_too_deeply_is_the_servers_failure_not_a_defect(
    chat: ScriptedChat, use_settings: UseSettings, caplog: pytest.LogCaptureFixture, where: str, kind: str
) -> None:
    chat.script(f"deep{where}", Turn(content="x"))
    async with fake_resources(respond={where: raw(b"[" * 100_000)}) as fake:
        with caplog.at_level(logging.DEBUG):
            out = await episode(use_settings, chat, fake.url, f"deep{where}")
    assert masked(out) == (True, 0.0, kind)
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    assert "Traceback" not in caplog.text


# --- what held, and must keep holding -----------------------------------------------------------
# (cookies per episode under concurrency: test_environment_episode.py's 50 concurrent episodes)


OPENING = b'{"reward": 1.0'
"""The verify answer the gzip bombs below open with."""


async def test_a_gzip_bomb_from_verify_is_refused_at_the_cap(chat: ScriptedChat, use_settings: UseSettings) -> None:
    chat.script("bomb", Turn(content="x"))
    async with fake_resources(respond={"verify": raw(gzip_bomb(OPENING), **{"Content-Encoding": "gzip"})}) as fake:
        out = await episode(use_settings, chat, fake.url, "bomb")
    assert masked(out) == (True, 0.0, VERIFIER_ERROR)
    assert len(json.dumps(out)) < 64 * 1024


async def test_a_gzip_bomb_from_a_tool_is_cut_at_the_tool_output_cap(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    chat.script("toolbomb", Turn(tool_calls=(tool("huge", size=0),)), Turn(content="ok"))
    async with fake_resources(respond={"huge": raw(gzip_bomb(OPENING), **{"Content-Encoding": "gzip"})}) as fake:
        out = await episode(use_settings, chat, fake.url, "toolbomb")
    assert masked(out) == (False, 1.0, None)
    seen = chat.requests("toolbomb")[1]["messages"][-1]["content"]
    assert seen.startswith('{"reward": 1.0, "pad": "') and "truncated" in seen
    assert len(seen) < 64 * 1024 + 200
