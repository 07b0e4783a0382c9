"""The /run pipeline against hostile or careless input: odd rows, bad settings, servers
that echo the key, lie about the instance, send absurd rewards or huge answers.

Each test is one protection; it fails if that protection is removed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from miles_nemogym import agent, errors, metrics, transport
from miles_nemogym.episode import run as episode_run
from miles_nemogym.runtime import Tally, current
from tests.support.agent_fixtures import call, fast_env, server
from tests.support.circuits import waiting_episodes
from tests.support.clean_env import clean_environ
from tests.support.eventually import eventually
from tests.support.fault_server import FaultServer
from tests.support.gzip_bomb import gzip_bomb
from tests.support.runtime_settings import UseSettings
from tests.support.samples import Sample

__all__ = ["fast_env", "server"]  # fixtures used by name

KEY = "sk-live/SECRET+0123456789/abcdef"  # slashes: JSON encoders may escape them as \/
INVALID_REQUEST = "miles_nemogym:invalid_request"


def json_answer(text: str, status: int = 200) -> web.Response:
    return web.Response(status=status, text=text, content_type="application/json")


def graded(result: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**result, **changes}


def assert_no_key_fragment(*texts: str) -> None:
    """No 8-character piece of the key survives, in any of ``texts``."""
    pieces = {KEY[i : i + 8] for i in range(len(KEY) - 7)}
    for text in texts:
        found = [piece for piece in pieces if piece in text]
        assert not found, found


# --- the API key ------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["slash", "unicode", "nested"])
async def test_an_escaped_echo_cut_by_truncation_leaks_no_piece_of_the_key(
    server: FaultServer,
    sympy_row: dict[str, Any],
    use_settings: UseSettings,
    caplog: pytest.LogCaptureFixture,
    form: str,
) -> None:
    use_settings(NEMO_GYM_POLICY_API_KEY=KEY)
    encoded = {
        "slash": KEY.replace("/", "\\/"),
        "unicode": "".join(f"\\u{ord(c):04x}" for c in KEY),
        "nested": json.dumps(json.dumps(KEY))[3:-3],  # JSON inside a JSON string
    }[form]
    # Placed so that the 300-character reason cut falls inside the echoed key.
    server.respond = lambda body: json_answer(
        '{"detail": [{"msg": "' + f"{form} echo ".ljust(250, "x") + '", "input": "' + encoded + '"}]}', 422
    )
    with caplog.at_level(logging.DEBUG):
        out = await call(sympy_row)
    assert caplog.text.count(f"{form} echo ") == 1  # logged (once per distinct message), so checked
    assert server.bodies[-1]["policy_api_key"] == KEY
    assert out["nemogym"]["failure_kind"] == "agent_request_failed"
    assert "***" in out["nemogym"]["failure_reason"]
    assert_no_key_fragment(json.dumps(out), caplog.text)


async def test_a_key_used_as_an_object_key_in_the_result_is_redacted(
    server: FaultServer, sympy_row: dict[str, Any], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_POLICY_API_KEY=KEY)

    def answer(body: dict[str, Any]) -> web.Response:
        metadata = {**sympy_result["metadata"], "echo": {KEY: 1, "plain " + KEY: 2}}
        text = json.dumps(graded(sympy_result, metadata=metadata)).replace("/", "\\/")
        return json_answer(text)

    server.respond = answer
    out = await call(sympy_row)
    assert out["nemogym"]["status"] == "ok"  # the result itself is sound
    assert set(out["eval_report"]["echo"]) == {"***", "plain ***"}
    assert_no_key_fragment(json.dumps(out))


@pytest.mark.parametrize("answer", ['{"reward": 1.0, "response": 5, "note": "%s"}', '{"reward": "%s"'])
async def test_an_undecodable_result_holding_the_key_is_scrubbed(
    server: FaultServer,
    sympy_row: dict[str, Any],
    use_settings: UseSettings,
    caplog: pytest.LogCaptureFixture,
    answer: str,
) -> None:
    """A 200 answer is scrubbed only in the parts kept; one that does not parse is
    scrubbed whole before its error is quoted."""
    use_settings(NEMO_GYM_POLICY_API_KEY=KEY)
    server.respond = lambda body: json_answer(answer % KEY.replace("/", "\\/"))
    with caplog.at_level(logging.DEBUG):
        out = await call(sympy_row)
    assert out["nemogym"]["failure_kind"] == "agent_run_error"
    assert "undecodable /run result" in out["nemogym"]["failure_reason"]
    assert_no_key_fragment(repr(out), caplog.text)


@pytest.mark.parametrize(
    "encoded",
    [
        KEY,
        KEY.replace("/", "\\/"),  # JSON with escaped slashes
        "".join(f"\\u{ord(c):04X}" for c in KEY),  # every character escaped, upper-case hex
        KEY[:5] + "".join(f"\\u{ord(c):04x}" for c in KEY[5:9]) + KEY[9:],  # mixed
        json.dumps(json.dumps(KEY))[3:-3],  # JSON inside a JSON string: \\\/
        KEY.replace("/", "%2F").replace("+", "%2b"),  # URL-encoded
    ],
)
def test_the_scrubber_removes_every_encoding_and_nothing_else(encoded: str) -> None:
    scrubber = errors.key_scrubber(KEY)
    assert scrubber is not None
    assert scrubber.scrub(f'{{"{encoded}": "a {encoded} b"}}'.encode()) == b'{"***": "a *** b"}'
    untouched = json.dumps({"near": KEY[:-1], "other": "sk-live\\/SECRET", "u": "\\u0073k"}).encode()
    assert scrubber.scrub(untouched) == untouched


@pytest.mark.parametrize(
    "encoded",
    [KEY, "".join(f"\\u{ord(c):04x}" for c in KEY), json.dumps(json.dumps(KEY))[3:-3], KEY.replace("/", "%2F")],
    ids=["plain", "unicode-escaped", "json-in-json", "url-encoded"],
)
def test_a_key_cut_by_a_cap_in_any_encoding_leaves_none_of_it(encoded: str) -> None:
    scrubber = errors.key_scrubber(KEY)
    assert scrubber is not None
    for cut in range(1, len(encoded)):
        kept = scrubber.scrub_cut(f'{{"out": "done, {encoded[:cut]}'.encode())
        assert kept.startswith(b'{"out": "done, ') and len(kept) <= len('{"out": "done, '), (cut, kept)
    assert scrubber.scrub_cut(f"{encoded} done.".encode()) == b"*** done."  # whole: scrubbed, the end kept


def test_a_cut_output_loses_at_most_what_could_begin_the_key() -> None:
    """Hex (every byte one a key's encoding could use) cut by the cap keeps all but its tail."""
    scrubber = errors.key_scrubber(KEY)
    assert scrubber is not None
    hexdump = ("0123456789abcdef" * 8192).encode()[:65536]
    assert len(scrubber.scrub_cut(hexdump)) == len(hexdump) - 8 * len(KEY)


@pytest.mark.parametrize("short_key", ["ok", "1", "0", "EMPTY"])
async def test_a_short_key_is_sent_not_redacted_and_never_fails_the_sample(
    server: FaultServer,
    sympy_row: dict[str, Any],
    use_settings: UseSettings,
    caplog: pytest.LogCaptureFixture,
    short_key: str,
) -> None:
    # Warned once per key per process; no other test uses these keys.
    use_settings(NEMO_GYM_POLICY_API_KEY=short_key)
    with caplog.at_level(logging.WARNING):
        first = await call(sympy_row)
        second = await call(sympy_row)
    assert server.bodies[-1]["policy_api_key"] == short_key
    for out in (first, second):
        assert out["nemogym"]["status"] == "ok" and out["nemogym"]["mask_sample"] is False
        assert out["eval_report"]["eval_report"][sympy_row["instance_id"]]["resolved"] is False
    warnings = [r.getMessage() for r in caplog.records if "treated as non-secret" in r.getMessage()]
    assert len(warnings) == 1
    assert short_key not in warnings[0].replace("NEMO_GYM", "")


# --- URL credentials --------------------------------------------------------------------------


async def test_credentials_in_urls_never_reach_reasons_or_logs(
    server: FaultServer, sympy_row: dict[str, Any], use_settings: UseSettings, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        bad_session = await call(sympy_row, base_url="http://miles:sessionpw@127.0.0.1:notaport/sessions/x")
        use_settings(NEMO_GYM_URL="http://gym:gympw@127.0.0.1:99999")  # a new run with it
        bad_gym = await call(sympy_row)
    assert bad_session["nemogym"]["failure_kind"] == INVALID_REQUEST
    assert "miles:***@" in bad_session["nemogym"]["failure_reason"]
    assert bad_gym["nemogym"]["failure_kind"] == "miles_nemogym:invalid_config"
    assert "gym:***@" in bad_gym["nemogym"]["failure_reason"]
    assert "miles:***@" in caplog.text and "gym:***@" in caplog.text  # both logged, so both checked
    assert "sessionpw" not in json.dumps([bad_session, bad_gym]) + caplog.text
    assert "gympw" not in json.dumps([bad_session, bad_gym]) + caplog.text
    assert server.bodies == []


async def test_a_server_echoing_a_url_with_a_password_is_redacted(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    server.respond = lambda body: web.Response(status=502, text="upstream http://admin:hunter22@10.0.0.5:8000/v1 down")
    out = await call(sympy_row)
    assert out["nemogym"]["failure_reason"] == "HTTP 502: upstream http://admin:***@10.0.0.5:8000/v1 down"


# --- the server's reward and instance ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (1e308, "1e+308 is outside NEMO_GYM_REWARD_RANGE=0,1"),
        (-5, "-5 is outside NEMO_GYM_REWARD_RANGE=0,1"),
        ("1.0", "not a number ('1.0')"),
        (True, "not a number (True)"),
    ],
)
async def test_an_invalid_server_reward_is_masked_and_scores_zero(
    server: FaultServer, sympy_row: dict[str, Any], sympy_result: dict[str, Any], value: Any, needle: str
) -> None:
    server.respond = lambda body: web.json_response(graded(sympy_result, reward=value))
    out = await call(sympy_row)
    record = out["nemogym"]
    assert (record["status"], record["failure_kind"], record["mask_sample"]) == ("failed", "verifier_error", True)
    assert needle in record["failure_reason"]
    assert out["reward"] == 0.0
    assert await agent.reward_func(None, Sample(metadata=out)) == 0.0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_a_non_finite_reward_leaves_a_strict_json_record(
    server: FaultServer, sympy_row: dict[str, Any], sympy_result: dict[str, Any], literal: str
) -> None:
    def answer(body: dict[str, Any]) -> web.Response:
        text = json.dumps(graded(sympy_result, reward=0.5, metadata={**sympy_result["metadata"], "score": 0.5}))
        return json_answer(text.replace('"reward": 0.5', f'"reward": {literal}').replace("0.5}", f"{literal}}}"))

    server.respond = answer
    out = await call(sympy_row)
    assert out["nemogym"]["failure_kind"] == "verifier_error"
    assert "not finite" in out["nemogym"]["failure_reason"]
    assert out["nemogym"]["server_reward"] is None
    json.dumps(out, allow_nan=False)  # raises on NaN/inf anywhere in what Miles stores


async def test_the_reward_range_is_a_setting(
    server: FaultServer, sympy_row: dict[str, Any], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    server.respond = lambda body: web.json_response(graded(sympy_result, reward=-0.5))
    use_settings(NEMO_GYM_REWARD_RANGE="-1,1")
    out = await call(sympy_row)
    assert (out["nemogym"]["status"], out["reward"]) == ("ok", -0.5)


async def test_a_result_for_another_instance_is_not_this_episodes_reward(
    server: FaultServer, sympy_row: dict[str, Any], gym_example_rollouts: list[dict[str, Any]]
) -> None:
    resolved = next(r for r in gym_example_rollouts if r["reward"] == 1.0)
    server.respond = lambda body: web.json_response(resolved)  # its own id and only report
    out = await call(sympy_row)
    assert out["nemogym"]["failure_kind"] == "agent_run_error" and out["reward"] == 0.0
    assert resolved["instance_id"] in out["nemogym"]["failure_reason"]
    # Without an instance id in the answer, its lone report under another id is refused too.
    server.respond = lambda body: web.json_response(graded(resolved, instance_id=None))
    out = await call(sympy_row)
    assert out["nemogym"]["mask_sample"] is True and out["reward"] == 0.0


async def test_the_instance_id_is_compared_case_insensitively(
    server: FaultServer, sympy_row: dict[str, Any], sympy_result: dict[str, Any]
) -> None:
    upper = sympy_row["instance_id"].upper()
    out = await call({**sympy_row, "instance_id": upper})  # nemo-gym answers in lower case
    assert out["nemogym"]["status"] == "ok"
    assert out["nemogym"]["instance_id"] == upper


# --- size of the answer -----------------------------------------------------------------------


async def test_a_gzip_bomb_is_refused_at_the_cap_without_reading_it_all(
    server: FaultServer, sympy_row: dict[str, Any], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_MAX_RESULT_BYTES=str(4 * 1024 * 1024))
    bomb = gzip_bomb(json.dumps(sympy_result).encode()[:-1])  # 256 MiB decoded
    server.respond = lambda body: web.Response(
        body=bomb, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
    )
    out = await call(sympy_row)
    record = out["nemogym"]
    assert (record["failure_kind"], record["mask_sample"]) == ("agent_run_error", True)
    assert "NEMO_GYM_MAX_RESULT_BYTES=4194304" in record["failure_reason"]
    assert len(server.bodies) == 1


def chunked_answer(text: str) -> web.Response:
    """An answer without a Content-Length: its size is known only as it is read."""
    response = json_answer(text)
    response.enable_chunked_encoding()
    return response


@pytest.mark.parametrize(
    ("framing", "at_least"),
    [(json_answer, "at least 5"), (chunked_answer, "at least ")],  # by its Content-Length (~5,025) / as read
)
async def test_an_oversized_plain_answer_is_refused(
    server: FaultServer,
    sympy_row: dict[str, Any],
    use_settings: UseSettings,
    framing: Callable[[str], web.Response],
    at_least: str,
) -> None:
    use_settings(NEMO_GYM_MAX_RESULT_BYTES="2048")
    server.respond = lambda body: framing('{"reward": 1.0, "pad": "' + "x" * 5000 + '"}')
    out = await call(sympy_row)
    assert (out["nemogym"]["failure_kind"], out["nemogym"]["mask_sample"]) == ("agent_run_error", True)
    assert at_least in out["nemogym"]["failure_reason"]
    assert "NEMO_GYM_MAX_RESULT_BYTES=2048" in out["nemogym"]["failure_reason"]


async def test_a_chunked_answer_within_the_cap_is_read_whole(
    server: FaultServer, sympy_row: dict[str, Any], sympy_result: dict[str, Any]
) -> None:
    server.respond = lambda body: chunked_answer(json.dumps(sympy_result))
    out = await call(sympy_row)
    assert out["nemogym"]["status"] == "ok"
    assert out["reward"] == sympy_result["reward"]


async def test_a_large_answer_is_classified_in_a_worker_thread(
    server: FaultServer, sympy_row: dict[str, Any], sympy_result: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the work runs, not how long the loop stalls: a stall bound is a timing test
    that fails on a loaded machine (the stall itself is measured by bench/agent_bench.py)."""
    threads: list[str] = []
    real = episode_run.classify_http

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(episode_run, "classify_http", spy)
    items = [{"type": "function_call", "arguments": "x" * 40}, {"type": "function_call_output"}] * 150_000
    big = json.dumps(graded(sympy_result, response={**sympy_result["response"], "output": items}))
    assert len(big) > 2 * episode_run._OFF_LOOP_BYTES
    server.respond = lambda body: json_answer(big)
    out = await call(sympy_row)
    assert out["nemogym"]["status"] == "ok"
    assert out["nemogym"]["turns"] == 150_000 and out["nemogym"]["tool_calls"] == 150_000
    server.respond = None
    assert (await call(sympy_row))["nemogym"]["status"] == "ok"  # a real-size answer
    main = threading.current_thread().name
    assert threads[0] != main and threads[1] == main


# --- settings that cannot work ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("NEMO_GYM_URL", "http://127.0.0.1:99999"),
        ("NEMO_GYM_URL", "http://127.0.0.1:abc"),
        ("NEMO_GYM_RUN_TIMEOUT", "inf"),
        ("NEMO_GYM_CONNECT_TIMEOUT", "nan"),
        ("NEMO_GYM_OUTAGE_TIMEOUT", "inf"),
        ("NEMO_GYM_REWARD_RANGE", "1,0"),
        ("NEMO_GYM_MAX_RESULT_BYTES", "10"),
    ],
)
async def test_unusable_settings_are_invalid_config_before_any_request(
    server: FaultServer, sympy_row: dict[str, Any], use_settings: UseSettings, var: str, value: str
) -> None:
    use_settings(**{var: value})
    out = await call(sympy_row)
    assert out["nemogym"]["failure_kind"] == "miles_nemogym:invalid_config"
    assert var in out["nemogym"]["failure_reason"]
    assert server.bodies == []


# --- odd arguments from Python ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ({"metadata": ["instance_id", "x"]}, "sample metadata must be a dict"),
        ({"metadata": "sympy__sympy-1"}, "sample metadata must be a dict"),
        ({"metadata": 7}, "sample metadata must be a dict"),
        ({"base_url": None}, "base_url must be a string"),
        ({"base_url": 8000}, "base_url must be a string"),
        ({"request_kwargs": [("temperature", 1.0)]}, "request_kwargs must be a dict"),
    ],
)
async def test_odd_arguments_are_invalid_requests_naming_the_field(
    server: FaultServer, sympy_row: dict[str, Any], arguments: dict[str, Any], needle: str
) -> None:
    metadata = arguments.pop("metadata", sympy_row)
    out = await call(metadata, **arguments)
    assert out["nemogym"]["failure_kind"] == INVALID_REQUEST, out["nemogym"]
    assert needle in out["nemogym"]["failure_reason"]
    assert server.bodies == []


async def test_a_lone_surrogate_is_an_invalid_request_naming_the_field(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    out = await call({**sympy_row, "problem_statement": "fix \udc80 this"})
    assert out["nemogym"]["failure_kind"] == INVALID_REQUEST
    assert "metadata['problem_statement']" in out["nemogym"]["failure_reason"]
    bad_id = await call({**sympy_row, "instance_id": "sympy\ud800"})
    assert bad_id["nemogym"]["failure_kind"] == INVALID_REQUEST
    json.dumps(bad_id).encode("utf-8")  # the record itself stays encodable
    assert server.bodies == []


@pytest.mark.parametrize("extra_body", ["{", "[1]"])
@pytest.mark.parametrize("trainer_extra", [{}, {"top_k": 20}])
async def test_a_bad_row_extra_body_is_refused_whatever_the_trainer_passes(
    server: FaultServer, sympy_row: dict[str, Any], extra_body: str, trainer_extra: dict[str, Any]
) -> None:
    row = {**sympy_row, "responses_create_params": {"input": [], "metadata": {"extra_body": extra_body}}}
    out = await call(row, request_kwargs={"temperature": 1.0, **trainer_extra})
    assert out["nemogym"]["failure_kind"] == INVALID_REQUEST
    assert "extra_body" in out["nemogym"]["failure_reason"]
    assert server.bodies == []


# --- the server's failure_kind ----------------------------------------------------------------


async def test_an_invalid_server_failure_kind_is_not_recorded_verbatim(
    server: FaultServer, sympy_row: dict[str, Any], sympy_result: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    kind = "provider_" + "x" * 5000 + "\nINJECTED"
    server.respond = lambda body: web.json_response(graded(sympy_result, mask_sample=True, failure_kind=kind))
    with caplog.at_level(logging.DEBUG):
        out = await call(sympy_row)
    record = out["nemogym"]
    assert record["failure_kind"] == "verifier_error" and record["mask_sample"] is True
    assert "invalid failure_kind 'provider_xxx" in record["failure_reason"]
    assert len(record["failure_reason"]) <= 300 and "\n" not in record["failure_reason"]
    assert "INJECTED" not in caplog.text
    keys = metrics.rollout_metrics([Sample(metadata=out)], current().ledger.drain())
    assert set(keys) >= {"nemogym/failure_rate/verifier_error"}
    assert all(len(key) < 80 for key in keys)


async def test_a_well_formed_unregistered_kind_is_kept_and_warned_once(
    server: FaultServer, sympy_row: dict[str, Any], sympy_result: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    # Warned once per process: no other test uses this kind.
    server.respond = lambda body: web.json_response(
        graded(sympy_result, mask_sample=True, failure_kind="swe:eval_image_missing")
    )
    with caplog.at_level(logging.WARNING):
        outs = [await call(sympy_row) for _ in range(3)]
    assert [o["nemogym"]["failure_kind"] for o in outs] == ["swe:eval_image_missing"] * 3
    assert sum("unregistered failure_kind" in r.getMessage() for r in caplog.records) == 1
    assert all(map(errors.check_server_kind, errors._KNOWN_KINDS))  # a registered kind is always kept as is


# --- abort and cancellation -------------------------------------------------------------------


async def test_an_abort_logs_one_line_and_records_what_was_sent(
    server: FaultServer, sympy_row: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    server.hold_s = 60
    tasks = [asyncio.create_task(call(sympy_row)) for _ in range(40)]
    await eventually(lambda: server.in_flight == 40, "all 40 requests reached the server")
    with caplog.at_level(logging.DEBUG, logger="miles_nemogym"):
        await agent.abort(None)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.getMessage() for r in lines] == [
        "abort: stopped 40 in-flight NeMo-Gym episodes: 40 sent and awaiting their result "
        "(the server may finish them), 0 not yet delivered; each is recorded as cancelled"
    ]
    for out in results:
        assert out["nemogym"]["failure_kind"] == "cancelled"
        assert out["nemogym"]["attempts"] == 1 and out["nemogym"]["elapsed_s"] > 0
        assert "may run on" in out["nemogym"]["failure_reason"]


@pytest.mark.parametrize("order", ["abort_then_cancel", "cancel_then_abort"])
async def test_the_callers_cancellation_propagates_even_with_an_abort(
    server: FaultServer, sympy_row: dict[str, Any], order: str
) -> None:
    """Python 3.10 has no ``Task.cancelling``; this must hold there too (CI runs it on 3.10)."""
    server.hold_s = 30
    tasks = [asyncio.create_task(call(sympy_row)) for _ in range(20)]
    await eventually(lambda: server.in_flight == 20, "all 20 requests reached the server")
    if order == "abort_then_cancel":
        current().in_flight.abort_all()
        for task in tasks:
            task.cancel()
    else:
        for task in tasks:
            task.cancel()
        current().in_flight.abort_all()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    assert sum(current().in_flight.abort_all().values()) == 0  # nothing left in flight to stop


async def test_abort_while_waiting_out_an_outage_counts_the_episode_as_not_delivered(
    sympy_row: dict[str, Any], use_settings: UseSettings, fast_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support.ports import free_port

    use_settings(NEMO_GYM_URL=f"http://127.0.0.1:{free_port()}")  # nothing listens
    task = asyncio.create_task(call(sympy_row))
    await eventually(lambda: waiting_episodes(current().circuits), "the episode waits out the outage")
    with caplog.at_level(logging.INFO, logger="miles_nemogym"):
        await agent.abort(None)
        out = await asyncio.wait_for(task, 5)
    await transport.close_pools()
    assert "0 sent and awaiting their result (the server may finish them), 1 not yet delivered" in caplog.text
    assert out["nemogym"]["failure_reason"] == "stopped by abort() before the request reached the server"


# --- the hooks never raise --------------------------------------------------------------------


async def test_the_reward_hook_scores_under_bad_settings(use_settings: UseSettings) -> None:
    use_settings(NEMO_GYM_RUN_TIMEOUT="1h")
    ok = Sample(metadata={"reward": 1.0, "nemogym": {"mask_sample": False}})
    masked = Sample(metadata={"reward": 1.0, "nemogym": {"mask_sample": True}})
    assert await agent.reward_func(None, [ok, masked]) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"passed": "3", "failed": 1}, 0.0),  # unreadable: the server's reward, counted
        ({"passed": -3, "failed": 1}, 0.0),
        ({"passed": 1, "failed": 3}, 0.25),
    ],
)
async def test_partial_mode_with_corrupted_counts_scores_the_server_reward(
    use_settings: UseSettings, counts: dict[str, Any], expected: float
) -> None:
    use_settings(NEMO_GYM_REWARD_MODE="partial")
    record = {
        "mask_sample": False,
        "resolved": False,
        "fail_to_pass": counts,
        "pass_to_pass": {"passed": 2, "failed": 0},
    }
    before = current().reward_problems["invalid_test_counts"]
    value = await agent.reward_func(None, Sample(metadata={"reward": 0.0, "nemogym": record}))
    assert value == expected
    assert current().reward_problems["invalid_test_counts"] == before + (expected == 0.0)


def test_log_rollout_survives_corrupted_records() -> None:
    good = {"episode_id": "a", "mask_sample": False, "resolved": True, "attempts": 1, "elapsed_s": 10.0, "turns": 4}
    corrupted = [
        {"episode_id": ["unhashable"], "mask_sample": False, "attempts": 1, "elapsed_s": "12s"},
        {"episode_id": {"x": 1}, "mask_sample": True, "failure_kind": "a\nb" * 100, "attempts": "1"},
        {"episode_id": "c", "mask_sample": False, "turns": math.nan, "fail_to_pass": {"passed": "x", "failed": 2}},
    ]
    samples = [Sample(metadata={"nemogym": record}) for record in [good, *corrupted]]
    values = metrics.rollout_metrics(samples, Tally(episodes=4, failures=Counter({"a\nb" * 100: 1})))
    assert values["nemogym/episodes"] == 4.0
    assert values["nemogym/failure_rate/unrecognized"] == 0.25
    assert values["nemogym/episode_time_max"] == 10.0
    assert values["nemogym/turns_mean"] == 4.0
    assert values["nemogym/corrupt_fields"] == 4.0  # "12s", "1", nan, "x"
    assert metrics.log_rollout(1, None, samples) is False


# --- the pool at interpreter exit -------------------------------------------------------------


def test_the_pool_is_closed_at_exit_of_a_miles_style_daemon_loop() -> None:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-m", "tests.support.daemon_loop_episodes", "20"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=clean_environ(),  # the script names its server in NEMO_GYM_URL; nothing of the shell's
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"] * 20
    assert "Unclosed" not in done.stderr, done.stderr
