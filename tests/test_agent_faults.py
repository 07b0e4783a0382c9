"""The agent function against a real loopback HTTP server: the fault matrix.

Each test names the rule it protects. The server records every request, so "never
re-sent" is asserted as "the server saw exactly one request".
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from miles_nemogym import agent, transport
from miles_nemogym.runtime import current
from tests.support.agent_fixtures import SESSION, call, fast_env, server
from tests.support.circuits import waiting_episodes
from tests.support.eventually import eventually
from tests.support.fault_server import FaultServer, ResetAfterBodyServer
from tests.support.pools import open_pools
from tests.support.ports import free_port
from tests.support.results import partially_passing
from tests.support.runtime_settings import UseSettings
from tests.support.samples import Sample

__all__ = ["fast_env", "server"]  # fixtures used by name
pytestmark = pytest.mark.usefixtures("fast_env")


async def test_graded_episode_is_a_valid_measurement(
    server: FaultServer, sympy_row: dict[str, Any], sympy_result: dict[str, Any]
) -> None:
    out = await call(sympy_row)
    record = out["nemogym"]
    assert record["status"] == "ok" and record["mask_sample"] is False
    assert record["attempts"] == 1 and record["http_status"] == 200
    assert out["eval_report"] == sympy_result["metadata"]  # the SWE-bench report, as the server sent it
    assert out["reward"] == sympy_result["reward"] == 0.0
    assert record["turns"] == 22 and record["tool_calls"] == 60  # the real sympy episode's
    assert len(server.bodies) == 1
    assert server.bodies[0]["policy_base_url"] == SESSION + "/v1"


async def test_server_down_then_up_is_sent_again_into_one_episode(
    sympy_row: dict[str, Any], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    port = free_port()
    use_settings(NEMO_GYM_URL=f"http://127.0.0.1:{port}")
    srv = FaultServer(result=sympy_result, port=port)
    task = asyncio.create_task(call(sympy_row))
    await eventually(lambda: waiting_episodes(current().circuits), "a try found the server down")
    assert not task.done()
    await srv.start()
    try:
        out = await asyncio.wait_for(task, 10)
    finally:
        await transport.close_pools()
        await srv.stop()
    assert out["nemogym"]["status"] == "ok"
    assert out["nemogym"]["attempts"] > 1
    assert len(srv.bodies) == 1


async def test_server_down_for_good_is_unreachable_after_the_outage_timeout(
    sympy_row: dict[str, Any], use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_URL=f"http://127.0.0.1:{free_port()}")
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="1")
    out = await call(sympy_row)
    await transport.close_pools()
    record = out["nemogym"]
    assert record["failure_kind"] == "transport_unreachable"
    assert record["mask_sample"] is True and out["reward"] == 0.0
    assert record["attempts"] == 1  # one undeliverable try; the circuit then only probes (no /run)


async def test_reset_after_body_is_a_peer_drop_never_resent(
    sympy_row: dict[str, Any], use_settings: UseSettings
) -> None:
    srv = await ResetAfterBodyServer().start()
    use_settings(NEMO_GYM_URL=srv.url)
    try:
        out = await call(sympy_row)
    finally:
        await transport.close_pools()
        await srv.stop()
    assert out["nemogym"]["failure_kind"] == "transport_peer_drop"
    assert out["nemogym"]["mask_sample"] is True
    assert out["nemogym"]["attempts"] == 1
    assert srv.requests == 1


@pytest.mark.parametrize(
    ("mode", "kind", "status"),
    [
        ("500", "agent_run_error", 500),
        ("422", "agent_request_failed", 422),
        ("nonjson", "agent_run_error", 200),
        ("error_metadata", "agent_run_error", 200),
    ],
)
async def test_server_failures_are_masked_and_not_resent(
    server: FaultServer, sympy_row: dict[str, Any], mode: str, kind: str, status: int
) -> None:
    server.mode = mode
    out = await call(sympy_row)
    record = out["nemogym"]
    assert record["status"] == "failed" and record["mask_sample"] is True
    assert record["failure_kind"] == kind and record["http_status"] == status
    assert out["reward"] == 0.0
    assert len(server.bodies) == 1


async def test_422_is_logged_once_with_a_hint(
    server: FaultServer, sympy_row: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    server.mode = "422"
    server.error_note = "logged-once test: "
    with caplog.at_level(logging.WARNING, logger="miles_nemogym"):
        for _ in range(5):
            await call(sympy_row)
    lines = [r.getMessage() for r in caplog.records if "422" in r.getMessage()]
    assert len(lines) == 1
    assert "mini_swe_agent_2" in lines[0] and "top_k" in lines[0]


async def test_deadline_exceeded_is_agent_timeout(
    server: FaultServer, sympy_row: dict[str, Any], use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_RUN_TIMEOUT="1")
    use_settings(NEMO_GYM_TIMEOUT_REWARD="mask")  # every timeout masked (tests/test_timeouts.py: the others)
    server.hold_s = 60  # far past the deadline: the outcome can only come from it
    out = await asyncio.wait_for(call(sympy_row), 30)
    assert out["nemogym"]["failure_kind"] == "agent_timeout"
    assert out["nemogym"]["mask_sample"] is True
    # Tried once, never sent again. Whether the request reached the server before the deadline
    # depends on the machine's load (the deadline covers the whole episode, sending included);
    # one that did was closed at the deadline, not left open.
    assert out["nemogym"]["attempts"] == 1 and len(server.bodies) <= 1
    await eventually(lambda: server.disconnects == len(server.bodies), "the held request was closed")


async def test_cancellation_propagates_and_closes_the_request(server: FaultServer, sympy_row: dict[str, Any]) -> None:
    server.hold_s = 30
    task = asyncio.create_task(call(sympy_row))
    await eventually(lambda: server.bodies, "the request reached the server")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: server.disconnects, "the server saw the request's connection close")
    assert server.disconnects == 1
    assert sum(current().in_flight.abort_all().values()) == 0  # nothing left in flight to stop


async def test_abort_stops_50_in_flight_runs_promptly(
    server: FaultServer, sympy_row: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    server.hold_s = 60
    tasks = [asyncio.create_task(call(sympy_row)) for _ in range(50)]
    await eventually(lambda: server.in_flight == 50, "all 50 requests reached the server")
    with caplog.at_level(logging.INFO, logger="miles_nemogym.agent"):
        await asyncio.wait_for(agent.abort(None), 1)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("abort:")]
    assert line.startswith("abort: stopped 50 in-flight NeMo-Gym episodes: 50 sent and awaiting their result"), line
    results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert all(r["nemogym"]["failure_kind"] == "cancelled" for r in results)
    assert all(r["nemogym"]["mask_sample"] for r in results)
    assert sum(current().in_flight.abort_all().values()) == 0  # nothing left in flight to stop
    assert len(server.bodies) == 50


async def test_300_concurrent_runs_share_one_pool_without_queueing(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    server.mode = "hold"  # each /run is answered only once all 300 are at the server at the same time
    tasks = [asyncio.create_task(call(sympy_row)) for _ in range(300)]
    await eventually(lambda: server.in_flight == 300, "all 300 /run requests at the server at once", 120)
    server.release.set()  # a pool limit would have held some back, and this would never be reached
    results = await asyncio.gather(*tasks)
    assert all(r["nemogym"]["status"] == "ok" for r in results)
    assert server.peak_in_flight == 300
    assert open_pools() == 1
    # Keep-alive: a second wave reuses the first wave's connections.
    first_peers = set(server.peers)
    await asyncio.gather(*(call(sympy_row) for _ in range(50)))
    assert server.peers == first_peers


async def test_external_host_rewrites_the_policy_url(
    server: FaultServer, sympy_row: dict[str, Any], use_settings: UseSettings
) -> None:
    use_settings(MILES_ROUTER_EXTERNAL_HOST="trainer-7.cluster")
    await call(sympy_row, base_url="http://0.0.0.0:30010/sessions/abc")
    assert server.bodies[-1]["policy_base_url"] == "http://trainer-7.cluster:30010/sessions/abc/v1"


async def test_wildcard_session_host_becomes_the_route_to_the_gym_host(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    await call(sympy_row, base_url="http://0.0.0.0:30010/sessions/abc")
    assert server.bodies[-1]["policy_base_url"] == "http://127.0.0.1:30010/sessions/abc/v1"


async def test_api_key_reaches_the_server_but_never_the_sample_or_logs(
    server: FaultServer,
    sympy_row: dict[str, Any],
    use_settings: UseSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "sk-test-SECRET-4242"
    use_settings(NEMO_GYM_POLICY_API_KEY=secret)
    server.mode = "echo_key_error"
    with caplog.at_level(logging.DEBUG):
        out = await call(sympy_row)
    assert server.bodies[-1]["policy_api_key"] == secret
    assert secret not in repr(out)
    assert "***" in out["nemogym"]["failure_reason"]
    assert secret not in caplog.text
    assert out["nemogym"]["mask_sample"] is True


async def test_a_rerolled_sample_does_not_send_previous_results(server: FaultServer, sympy_row: dict[str, Any]) -> None:
    first = await call(sympy_row)
    await call({**sympy_row, **first})
    assert not {"reward", "eval_report", "nemogym"} & set(server.bodies[-1])


async def test_bad_task_row_is_recorded_not_sent(server: FaultServer, sympy_row: dict[str, Any]) -> None:
    row = {k: v for k, v in sympy_row.items() if k != "instance_id"}
    out = await call(row)
    assert out["nemogym"]["failure_kind"] == "miles_nemogym:invalid_request"
    assert "instance_id" in out["nemogym"]["failure_reason"]
    assert server.bodies == []


async def test_bad_configuration_is_recorded_with_the_variable_name(
    server: FaultServer, sympy_row: dict[str, Any], use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_RUN_TIMEOUT="1h")
    out = await call(sympy_row)
    assert out["nemogym"]["failure_kind"] == "miles_nemogym:invalid_config"
    assert "NEMO_GYM_RUN_TIMEOUT" in out["nemogym"]["failure_reason"]
    assert server.bodies == []


def test_a_new_event_loop_gets_its_own_session(
    sympy_row: dict[str, Any], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    """Miles may run several loops over a process's life; a session never crosses loops."""

    async def once() -> None:
        srv = await FaultServer(result=sympy_result).start()
        use_settings(NEMO_GYM_URL=srv.url)  # each loop a new run: its settings name this server
        try:
            assert open_pools() == 0  # the other loop's open pool is not this loop's
            out = await call(sympy_row)
            assert out["nemogym"]["status"] == "ok"
            assert open_pools() == 1
        finally:
            await srv.stop()

    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        first.run_until_complete(once())
        second.run_until_complete(once())  # while the first loop's pool is still open
    finally:
        for loop in (first, second):
            loop.run_until_complete(transport.close_pools())
            loop.close()


async def test_a_malformed_session_url_is_recorded_not_raised(server: FaultServer, sympy_row: dict[str, Any]) -> None:
    out = await call(sympy_row, base_url="http://127.0.0.1:notaport/sessions/x")
    assert out["nemogym"]["failure_kind"] == "miles_nemogym:invalid_request"
    assert server.bodies == []


async def test_a_caller_cancelled_during_abort_still_sees_its_cancellation(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    server.hold_s = 30
    task = asyncio.create_task(call(sympy_row))
    await eventually(lambda: server.bodies, "the request reached the server")
    current().in_flight.abort_all()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sum(current().in_flight.abort_all().values()) == 0  # nothing left in flight to stop


async def test_an_echoed_key_is_removed_before_any_truncation(
    server: FaultServer,
    sympy_row: dict[str, Any],
    use_settings: UseSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "sk-SECRET-0123456789abcdefghij"
    use_settings(NEMO_GYM_POLICY_API_KEY=secret)
    server.mode = "echo_key_422"
    server.error_note = "echoed-key test: "
    with caplog.at_level(logging.DEBUG):
        out = await call(sympy_row)
    assert out["nemogym"]["failure_kind"] == "agent_request_failed"
    assert caplog.text.count("echoed-key test: ") == 1  # logged, so the log is checked too
    # No piece of the key either: the reason is cut at 300 characters right inside it.
    assert "SECRET" not in repr(out) and "SECRET" not in caplog.text


@pytest.mark.parametrize(
    "change",
    [
        {"instance_id": 123},
        {"instance_id": ["a"]},
        {"responses_create_params": {"input": [], "metadata": {"extra_body": {"x": {1, 2}}}}},
        {"responses_create_params": {"input": [], "metadata": {"extra_body": {1: "a", "b": 2}}}},
        {"responses_create_params": {"input": [], "metadata": {"extra_body": {"min_p": float("nan")}}}},
    ],
)
async def test_odd_rows_built_in_python_are_recorded_not_raised(
    server: FaultServer, sympy_row: dict[str, Any], change: dict[str, Any]
) -> None:
    out = await call({**sympy_row, **change})
    assert out["nemogym"]["failure_kind"] == "miles_nemogym:invalid_request", out["nemogym"]
    assert server.bodies == []


@pytest.mark.parametrize(("mode", "expected"), [("binary", 0.0), ("partial", 0.4)])
async def test_returned_reward_is_final_in_each_reward_mode(
    gym_example_rows: list[dict[str, Any]],
    gym_example_rollouts: list[dict[str, Any]],
    use_settings: UseSettings,
    mode: str,
    expected: float,
) -> None:
    """Under session server v2 Miles takes ``reward`` from this dict and never calls the
    reward hook, so the dict must carry the hook's score: 4 of 10 FAIL_TO_PASS -> 0.4."""
    row = next(r for r in gym_example_rows if r["instance_id"].startswith("pylint"))
    result = partially_passing(next(r for r in gym_example_rollouts if r["instance_id"] == row["instance_id"]), 4)
    srv = await FaultServer(result=result).start()
    use_settings(NEMO_GYM_URL=srv.url)
    use_settings(NEMO_GYM_REWARD_MODE=mode)
    try:
        out = await call(row)
    finally:
        await transport.close_pools()
        await srv.stop()
    assert out["nemogym"]["server_reward"] == 0.0
    assert out["nemogym"]["fail_to_pass"] == {"passed": 4, "failed": 6}
    assert out["reward"] == expected
    assert await agent.reward_func(None, Sample(metadata=out)) == expected


# --- one episode function: every path ends in the same finish step ------------------------------------


async def test_every_path_finishes_with_an_episode_id_and_the_task_instance(
    server: FaultServer, sympy_row: dict[str, Any], use_settings: UseSettings
) -> None:
    graded = await call(sympy_row)
    bad_route = await call(sympy_row, base_url="http://127.0.0.1:notaport/sessions/x")
    # Each new setting: a new run. Nothing listens at this URL.
    use_settings(NEMO_GYM_URL=f"http://127.0.0.1:{free_port()}", NEMO_GYM_OUTAGE_TIMEOUT="0.2")
    undelivered = await call(sympy_row)
    use_settings(NEMO_GYM_RUN_TIMEOUT="1h")
    bad_settings = await call(sympy_row)
    outs = [graded, bad_route, undelivered, bad_settings]
    kinds = [out["nemogym"]["failure_kind"] for out in outs]
    assert kinds == [None, "miles_nemogym:invalid_request", "transport_unreachable", "miles_nemogym:invalid_config"]
    assert [out["nemogym"]["instance_id"] for out in outs] == [sympy_row["instance_id"]] * 4
    ids = [out["nemogym"]["episode_id"] for out in outs]
    assert len(set(ids)) == 4 and all(len(i) == 32 and set(i) <= set("0123456789abcdef") for i in ids)


class _ExplodingRow(dict[str, Any]):
    """A task row whose items cannot be read: a defect on our side, not a bad row."""

    def items(self) -> Any:
        raise RuntimeError("boom while reading the row")


async def test_a_defect_is_one_client_error_record_never_a_raise(
    server: FaultServer, sympy_row: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="miles_nemogym"):
        out = await call(_ExplodingRow(sympy_row))
    record = out["nemogym"]
    assert (record["failure_kind"], record["failure_reason"]) == (
        "miles_nemogym:client_error",
        "RuntimeError: boom while reading the row",
    )
    assert record["mask_sample"] is True and record["instance_id"] == sympy_row["instance_id"]
    assert out["reward"] == 0.0 and server.bodies == []
    assert f"miles-nemogym client error for {sympy_row['instance_id']}" in caplog.text
