"""Training-run integrity without Miles: which groups are kept, dropped or salvaged, the episode ledger,
the server circuit and the run stop, against real loopback servers.

The same behaviours through Miles' real rollout step are in
``tests/integration/test_miles_integrity.py``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from miles_nemogym import agent, groups, metrics, transport
from miles_nemogym import runtime as circuit_module
from miles_nemogym.episode.record import SWE_ENVIRONMENT, failure
from miles_nemogym.errors import RunStopped
from miles_nemogym.groups import stop_reason
from miles_nemogym.runtime import Ledger, current
from tests.support.agent_fixtures import call, distinct_rows, fast_env, quick_probe
from tests.support.circuits import is_open, waiting_episodes
from tests.support.eventually import eventually
from tests.support.fault_server import FaultServer
from tests.support.ports import free_port
from tests.support.runtime_settings import UseSettings
from tests.support.samples import Sample, Status

__all__ = ["distinct_rows", "fast_env", "quick_probe"]  # fixtures used by name
pytestmark = pytest.mark.usefixtures("fast_env", "quick_probe")


def valid(episode: str, reward: float = 1.0) -> Sample:
    record = {"status": "ok", "episode_id": episode, "mask_sample": False}
    return Sample(metadata={"reward": reward, "nemogym": record})


def masked(episode: str, kind: str = "agent_run_error") -> Sample:
    outcome = failure(kind, "x")
    outcome.record.episode_id = episode
    return Sample(metadata=outcome.to_metadata())


class Args:
    """The Miles arguments the filter reads, with the post-process hook wired as the launcher does."""

    def __init__(self, n_samples_per_prompt: int, post_process: str | None = groups.POST_PROCESS_PATH) -> None:
        self.n_samples_per_prompt = n_samples_per_prompt
        self.custom_reward_post_process_path = post_process


# -- which groups are kept ---------------------------------------------------------------------


def test_one_failed_episode_among_four_is_salvaged_by_default() -> None:
    group = [valid("a"), valid("b", 0.0), masked("c"), valid("d")]
    out = groups.check_episode_group(Args(4), group)
    assert (out.keep, out.reason) == (True, None)
    tally = current().ledger.drain()
    assert (tally.groups_salvaged, tally.groups_dropped) == (1, 0)


def test_without_the_post_process_hook_partly_failed_groups_are_dropped(caplog: pytest.LogCaptureFixture) -> None:
    # Miles would otherwise normalise the failed episode's 0.0 into the group.
    group = [valid("a"), valid("b"), masked("c"), valid("d")]
    out = groups.check_episode_group(Args(4, post_process=None), group)
    assert (out.keep, out.reason) == (False, "nemogym_agent_run_error")
    assert groups.check_episode_group(Args(4, post_process=None), group[:2]).keep is True


def test_min_valid_zero_drops_on_any_failure(use_settings: UseSettings) -> None:
    use_settings(NEMO_GYM_MIN_VALID_PER_GROUP="0")
    out = groups.check_episode_group(Args(4), [valid("a"), valid("b"), masked("c", "transport_peer_drop"), valid("d")])
    assert (out.keep, out.reason) == (False, "nemogym_transport_peer_drop")
    tally = current().ledger.drain()
    assert (tally.groups_salvaged, tally.groups_dropped) == (0, 1)


@pytest.mark.parametrize(
    ("min_valid", "n_valid", "keep"),
    [("2", 2, True), ("2", 1, False), ("3", 2, False), ("4", 3, False), ("9", 3, False), ("1", 1, True)],
)
def test_min_valid_per_group_counts_valid_episodes(
    use_settings: UseSettings, min_valid: str, n_valid: int, keep: bool
) -> None:
    use_settings(NEMO_GYM_MIN_VALID_PER_GROUP=min_valid)
    group = [valid(f"v{i}") for i in range(n_valid)] + [masked(f"m{i}") for i in range(4 - n_valid)]
    out = groups.check_episode_group(Args(4), group)
    assert out.keep is keep
    assert out.reason == (None if keep else "nemogym_agent_run_error")


def test_min_valid_is_clamped_to_the_group_size(use_settings: UseSettings) -> None:
    # 9 > n=4 means "all four": a full group is kept, any failure drops it.
    use_settings(NEMO_GYM_MIN_VALID_PER_GROUP="9")
    assert groups.check_episode_group(Args(4), [valid(f"v{i}") for i in range(4)]).keep is True
    assert groups.check_episode_group(Args(4), [valid("a"), valid("b"), valid("c"), masked("d")]).keep is False


def test_v2_episodes_are_counted_once_over_their_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under session server v2 one episode may be several samples; min 2 needs two episodes.
    group = [[valid("a"), valid("a"), valid("a")], [masked("b"), masked("b")], [masked("c")], [masked("d")]]
    out = groups.check_episode_group(Args(4), group)
    assert (out.keep, out.reason) == (False, "nemogym_agent_run_error")
    group[1] = [valid("b"), valid("b")]
    assert groups.check_episode_group(Args(4), group).keep is True


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (Sample(metadata={}, status=Status.ABORTED), "group_has_aborted"),
        (Sample(metadata={}), "nemogym_missing_record"),
    ],
)
def test_an_aborted_or_recordless_sample_with_no_failed_episode_held_for_it_drops_its_group(
    bad: Sample, reason: str
) -> None:
    out = groups.check_episode_group(Args(4), [valid("a"), valid("b"), valid("c"), bad])
    assert (out.keep, out.reason) == (False, reason)


# -- the ledger and what log_rollout reports ---------------------------------------------------


def test_ledger_counts_every_episode_and_keeps_cancelled_apart() -> None:
    book = Ledger()
    for kind in [None, None, "transport_unreachable", "cancelled", "agent_run_error", "transport_unreachable"]:
        outage = 2.5 if kind == "transport_unreachable" else 0.0
        book.record_episode(kind, outage_wait_s=outage, aborted=kind == "cancelled")  # stopped by our abort
    book.record_group(kept=True, salvaged=True)
    book.record_group(kept=False, salvaged=False)
    book.record_episode("cancelled", "eval", "verified", outage_wait_s=7.5, aborted=True)  # charged to eval, not train
    tally = book.drain()
    assert tally.episodes == 5 and tally.cancelled == 1
    assert dict(tally.failures) == {"transport_unreachable": 2, "agent_run_error": 1}
    assert (tally.groups_salvaged, tally.groups_dropped, tally.outage_wait_s) == (1, 1, 5.0)
    assert book.drain("eval", "verified").outage_wait_s == 7.5
    assert book.drain().episodes == 0  # a new period
    assert book.streak() == (
        3,
        {"agent_run_error": 1, "transport_unreachable": 2},
        {SWE_ENVIRONMENT: 3},
    )  # cancelled: not in it


def test_ledger_is_thread_safe() -> None:
    book = Ledger()

    def work() -> None:
        for i in range(2000):
            book.record_episode(None if i % 2 else "agent_timeout")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tally = book.drain()
    assert tally.episodes == 16000 and tally.failures["agent_timeout"] == 8000


def test_log_metrics_count_failures_that_left_no_record_on_a_sample() -> None:
    # Two episodes failed before their first policy call: Miles returned their samples
    # ABORTED without our dict, and the filter dropped their group.
    for kind in [None, None, None, "transport_unreachable", "miles_nemogym:invalid_request", "cancelled"]:
        current().ledger.record_episode(kind, aborted=kind == "cancelled")  # the last one stopped by our abort
    current().ledger.record_group(kept=False, salvaged=False)
    current().ledger.record_group(kept=True, salvaged=True)
    kept = [valid("a"), valid("b"), masked("c", "transport_peer_drop"), valid("d")]
    m = metrics.rollout_metrics(kept, current().ledger.drain())
    assert m["nemogym/episodes"] == 5.0
    assert m["nemogym/episodes_cancelled"] == 1.0
    assert m["nemogym/failure_rate"] == pytest.approx(2 / 5)
    assert m["nemogym/failure_rate/transport_unreachable"] == pytest.approx(1 / 5)
    assert m["nemogym/failure_rate/miles_nemogym_invalid_request"] == pytest.approx(1 / 5)
    assert "nemogym/failure_rate/transport_peer_drop" not in m  # the samples' view is replaced
    assert (m["nemogym/groups_salvaged"], m["nemogym/groups_dropped"]) == (1.0, 1.0)
    assert m["nemogym/samples_zero_loss"] == 1.0
    assert m["nemogym/outage_wait_s"] == 0.0


# -- outages and the run stop, against loopback servers ----------------------------------------


async def test_outage_mid_step_waits_and_sends_each_episode_once(
    distinct_rows: list[dict[str, Any]],
    sympy_result: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    use_settings: UseSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(circuit_module, "_WARN_EVERY_S", 0.3)
    port = free_port()
    use_settings(NEMO_GYM_URL=f"http://127.0.0.1:{port}")
    server = FaultServer(result=sympy_result, port=port)  # graded for each instance it is sent
    caplog.set_level(logging.WARNING, logger="miles_nemogym.runtime")
    tasks = [asyncio.create_task(call(row)) for row in distinct_rows]
    # The server is down: every episode opened or met the circuit, and the probe says so.
    await eventually(
        lambda: waiting_episodes(current().circuits) == len(distinct_rows), f"all {len(distinct_rows)} episodes wait"
    )
    all_waiting = time.monotonic()
    assert is_open(current().circuits)
    counted = f"{len(distinct_rows)} episodes waiting"
    await eventually(lambda: counted in caplog.text, "the probe's warning counts them")
    await asyncio.sleep(max(0.0, all_waiting + 1.0 - time.monotonic()))
    assert not any(task.done() for task in tasks)
    down_s = time.monotonic() - all_waiting
    await server.start()
    try:
        outs = await asyncio.wait_for(asyncio.gather(*tasks), 20)
    finally:
        await transport.close_pools()
        await server.stop()
    assert [out["nemogym"]["status"] for out in outs] == ["ok"] * len(distinct_rows)
    # Nothing lost, none twice; the probe never POSTed /run.
    assert sorted(body["instance_id"] for body in server.bodies) == sorted(row["instance_id"] for row in distinct_rows)
    assert not is_open(current().circuits) and current().circuits.stop_error() is None
    tally = current().ledger.drain()
    assert tally.episodes == len(distinct_rows) and not tally.failures
    assert tally.outage_wait_s >= len(distinct_rows) * down_s


async def test_abort_and_cancellation_work_while_episodes_wait(
    distinct_rows: list[dict[str, Any]], use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_URL=f"http://127.0.0.1:{free_port()}")
    waiting = [asyncio.create_task(call(row)) for row in distinct_rows[:3]]
    cancelled_by_caller = asyncio.create_task(call(distinct_rows[3]))
    await eventually(lambda: waiting_episodes(current().circuits) == 4, "all 4 episodes wait")
    cancelled_by_caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled_by_caller
    await agent.abort(None)
    outs = await asyncio.wait_for(asyncio.gather(*waiting), 5)
    await transport.close_pools()
    assert [out["nemogym"]["failure_kind"] for out in outs] == ["cancelled"] * 3
    assert waiting_episodes(current().circuits) == 0
    tally = current().ledger.drain()
    assert (tally.episodes, tally.cancelled) == (0, 3)
    assert current().ledger.streak() == (0, {}, {})  # an abort is not a failure


async def test_server_down_for_good_fails_waiting_episodes_and_the_filter_stops_the_run(
    distinct_rows: list[dict[str, Any]], use_settings: UseSettings
) -> None:
    url = f"http://user:pw@127.0.0.1:{free_port()}"
    use_settings(NEMO_GYM_URL=url)
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="1.5")
    started = asyncio.get_running_loop().time()
    outs = await asyncio.wait_for(asyncio.gather(*(call(row) for row in distinct_rows[:3])), 10)
    elapsed = asyncio.get_running_loop().time() - started
    await transport.close_pools()
    assert [out["nemogym"]["failure_kind"] for out in outs] == ["transport_unreachable"] * 3
    assert 1.5 <= elapsed < 4.0
    with pytest.raises(RunStopped) as stopped:
        groups.check_episode_group(Args(4), [Sample(metadata={}, status=Status.ABORTED)] * 4)
    message = str(stopped.value)
    assert "NEMO_GYM_OUTAGE_TIMEOUT=1.5s" in message and "127.0.0.1" in message and "pw" not in message
    # Later episodes fail at once instead of spinning the run.
    out = await asyncio.wait_for(call(distinct_rows[4]), 2)
    assert out["nemogym"]["failure_kind"] == "transport_unreachable"


async def test_failure_streak_stops_the_run_after_stopping_in_flight_episodes(
    distinct_rows: list[dict[str, Any]], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_MAX_FAILURE_STREAK="3")
    holding = await FaultServer(result=sympy_result, mode="hold").start()
    failing = await FaultServer(result=sympy_result, mode="500").start()
    try:
        use_settings(NEMO_GYM_URL=holding.url)
        in_flight = asyncio.create_task(call(distinct_rows[0]))
        await eventually(lambda: holding.bodies, "the first episode reached the holding server")
        # The same run (its runtime kept), its later episodes sent to another server.
        failing_server = current().settings.with_overrides(gym_url=failing.url)
        for row in distinct_rows[1:3]:
            assert (await call(row, settings=failing_server))["nemogym"]["failure_kind"] == "agent_run_error"
        groups.check_episode_group(Args(4), [valid("a"), valid("b")])  # 2 < 3: goes on
        assert (await call(distinct_rows[3], settings=failing_server))["nemogym"]["failure_kind"] == "agent_run_error"
        with pytest.raises(RunStopped, match=r"3 NeMo-Gym episodes in a row failed.*agent_run_error x3"):
            groups.check_episode_group(Args(4), [valid("a"), valid("b")])
        out = await asyncio.wait_for(in_flight, 5)
        assert out["nemogym"]["failure_kind"] == "cancelled"
    finally:
        await transport.close_pools()
        await holding.stop()
        await failing.stop()


async def test_a_valid_episode_resets_the_streak_and_zero_disables_it(use_settings: UseSettings) -> None:
    use_settings(NEMO_GYM_MAX_FAILURE_STREAK="2")
    current().ledger.record_episode("agent_run_error")
    current().ledger.record_episode(None)
    current().ledger.record_episode("agent_timeout")
    assert stop_reason(current().settings) is None
    current().ledger.record_episode("agent_timeout")
    assert "agent_timeout x2" in (stop_reason(current().settings) or "")
    # The same streak (this runtime's ledger) under NEMO_GYM_MAX_FAILURE_STREAK=0: never a stop.
    assert stop_reason(current().settings.with_overrides(max_failure_streak=0)) is None


async def test_a_server_that_reports_its_episodes_cancelled_is_failing_not_aborted(
    distinct_rows: list[dict[str, Any]], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    # NeMo-Gym's own "cancelled" (a server shutting down cancels its episodes) is a paid, failed
    # episode: counted and in the streak, unlike the ones our abort() stops.
    use_settings(NEMO_GYM_MAX_FAILURE_STREAK="2")
    answer = {**sympy_result, "mask_sample": True, "failure_kind": "cancelled", "failure_reason": "shutdown"}
    srv = await FaultServer(result=answer).start()
    try:
        use_settings(NEMO_GYM_URL=srv.url)
        outs = [await call(row) for row in distinct_rows[:2]]
    finally:
        await transport.close_pools()
        await srv.stop()
    assert [(out["nemogym"]["failure_kind"], out["nemogym"]["mask_sample"]) for out in outs] == [
        ("cancelled", True)
    ] * 2
    with pytest.raises(RunStopped, match="cancelled x2"):
        groups.check_episode_group(Args(4), [valid("a"), valid("b")])
    tally = current().ledger.drain()
    assert (tally.episodes, tally.cancelled, dict(tally.failures)) == (2, 0, {"cancelled": 2})
