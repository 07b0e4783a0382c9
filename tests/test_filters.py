"""``filters`` on its own: the Miles group filter's keep/drop, the salvage wiring it checks, what
it records in the ledger, and the run-stop rule (``stop_reason``, ``check_run``)."""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from miles_nemogym import filters
from miles_nemogym.episode.record import failure
from miles_nemogym.errors import RunStopped
from miles_nemogym.runtime import current
from miles_nemogym.salvage import HOOK_PATH
from tests.support.ports import free_port
from tests.support.runtime_settings import UseSettings
from tests.support.salvage_samples import aborted, failed, valid

# The hooks run on the settings given here (defaults unless a test gives one), never the shell's.
pytestmark = pytest.mark.usefixtures("use_settings")


@dataclass
class Args:
    custom_reward_post_process_path: str | None = HOOK_PATH
    n_samples_per_prompt: int | None = 4


class Unreadable:
    """A sample whose metadata cannot be read."""

    @property
    def metadata(self) -> dict[str, Any]:
        raise ValueError("corrupted")


def test_a_group_of_valid_episodes_is_kept_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "miles", None)  # without Miles: our stand-in of its output type
    filters._output_type.cache_clear()
    out = filters.check_episode_group(Args(), [valid(e) for e in "abcd"])
    assert (type(out), out.keep, out.reason) == (filters.FilterOutput, True, None)
    tally = current().ledger.drain()
    assert (tally.groups_dropped, tally.groups_salvaged) == (0, 0)


def test_a_partly_failed_group_is_salvaged_when_the_hook_is_wired() -> None:
    group = [valid("a"), valid("b"), failed("c"), failed("d")]
    assert filters.check_episode_group(Args(), group).keep is True
    assert filters.judge_group(Args(), group) == (None, True)
    assert current().ledger.drain().groups_salvaged == 1  # judge_group records nothing; the filter once


def test_without_the_hook_a_partly_failed_group_is_dropped_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    group = [valid("a"), valid("b"), valid("c"), failed("d", kind="agent_timeout")]
    with caplog.at_level(logging.WARNING, logger="miles_nemogym.filters"):
        outs = [filters.check_episode_group(Args(custom_reward_post_process_path=None), group) for _ in range(2)]
    assert [(out.keep, out.reason) for out in outs] == [(False, "nemogym_agent_timeout")] * 2
    assert [r.getMessage().count(HOOK_PATH) for r in caplog.records] == [1]
    assert current().ledger.drain().groups_dropped == 2


def test_the_group_size_miles_asked_for_sets_the_bar(use_settings: UseSettings) -> None:
    use_settings(NEMO_GYM_MIN_VALID_PER_GROUP="3")
    seen = [valid("a"), valid("b"), failed("c")]  # 3 of the 4 asked for came back
    assert filters.judge_group(Args(n_samples_per_prompt=4), seen) == ("nemogym_transport_peer_drop", False)
    assert filters.judge_group(Args(n_samples_per_prompt=2), seen) == (None, True)


def test_an_unreadable_group_is_dropped_not_raised() -> None:
    out = filters.check_episode_group(Args(), [valid("a"), Unreadable()])
    assert (out.keep, out.reason) == (False, "nemogym_unreadable_record")


def test_a_failed_episode_held_for_its_aborted_sample_is_given_back_before_the_verdict() -> None:
    lost = failed("e-lost", "t9")
    current().held.hold("t9", "e-lost", lost.metadata)
    group = [valid("a"), valid("b"), valid("c"), aborted("t9")]
    assert filters.check_episode_group(Args(), group).keep is True
    assert group[3].metadata["nemogym"]["episode_id"] == "e-lost" and len(current().held) == 0
    unheld = [valid("a"), valid("b"), valid("c"), aborted("t8")]  # Miles' own abort: nothing to give back
    assert filters.check_episode_group(Args(), unheld).reason == "group_has_aborted"


def test_no_reason_to_stop_by_default() -> None:
    assert filters.stop_reason(current().settings) is None
    filters.check_run(current().settings)


async def test_a_failure_streak_stops_the_run_and_what_is_in_flight(use_settings: UseSettings) -> None:
    use_settings(NEMO_GYM_MAX_FAILURE_STREAK="3")
    for _ in range(2):
        current().ledger.record_episode("transport_peer_drop")
    assert filters.stop_reason(current().settings) is None
    current().ledger.record_episode("agent_timeout")
    reason = filters.stop_reason(current().settings)
    assert reason is not None and reason.startswith("3 NeMo-Gym episodes in a row failed")
    started = asyncio.Event()

    async def waits(_: Any) -> Any:
        started.set()
        await asyncio.Event().wait()
        return failure("x", "not reached")

    running = asyncio.create_task(current().in_flight.run(waits))
    await asyncio.wait_for(started.wait(), 10)
    with pytest.raises(RunStopped, match="NEMO_GYM_MAX_FAILURE_STREAK=3"):
        filters.check_episode_group(Args(), [valid(e) for e in "abcd"])
    assert (await asyncio.wait_for(running, 10)).record.failure_kind == "cancelled"
    current().ledger.record_episode(None)  # a valid episode ends the streak
    assert filters.stop_reason(current().settings) is None


async def test_an_outage_past_its_timeout_stops_the_run() -> None:
    circuit = current().circuits.for_url(f"http://127.0.0.1:{free_port()}", "NEMO_GYM_URL")
    circuit.trip(0.2, "transport_unreachable", "refused")
    assert filters.stop_reason(current().settings) is None  # open, not given up: episodes wait
    gave_up, waited = await asyncio.wait_for(circuit.wait(), 10)
    assert gave_up == "transport_unreachable" and waited < 5
    with pytest.raises(RunStopped, match=r"could not be reached .*NEMO_GYM_OUTAGE_TIMEOUT=0\.2s"):
        filters.check_run(current().settings)
