"""``groups`` on its own: the group verdict; the filter's keep/drop, the salvage wiring it checks,
what it records in the ledger and the run-stop rule (``stop_reason``, ``check_run``); the reward
post-process hook (Miles' normaliser stood in for); and holding a failed episode until its
ABORTED sample comes back."""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from miles_nemogym import groups
from miles_nemogym.episode.record import Task, eval_overrides, failure
from miles_nemogym.errors import CANCELLED, POLICY_TIMEOUT, RunStopped
from miles_nemogym.groups import GROUP_HAS_ABORTED, POST_PROCESS_PATH, group_verdict
from miles_nemogym.runtime import HeldEpisodes, current
from tests.support.circuits import held_count
from tests.support.ports import free_port
from tests.support.runtime_settings import UseSettings
from tests.support.salvage_samples import aborted, failed, valid
from tests.support.samples import Sample, Status

# The hooks run on the settings given here (defaults unless a test gives one), never the shell's.
pytestmark = pytest.mark.usefixtures("use_settings")

DROP = "nemogym_transport_peer_drop"
"""The drop reason names the first failed episode's kind."""

# -- group_verdict --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("samples", "min_valid", "group_size", "verdict"),
    [
        ([valid("a"), valid("b")], 2, None, (None, False)),
        ([valid("a"), valid("b"), valid("c"), failed("d")], 2, None, (None, True)),
        ([valid("a"), failed("b"), failed("c", kind="agent_timeout"), failed("d")], 2, None, (DROP, False)),
        ([valid("a"), valid("b"), failed("c")], 0, None, (DROP, False)),  # 0: drop on any failure
        ([valid("a"), valid("b"), failed("c")], 5, None, (DROP, False)),  # clamped to the 3 seen
        ([valid("a"), failed("b")], 5, 1, (None, True)),  # clamped to the group's size
        ([valid("a"), valid("a"), failed("b")], 2, None, (DROP, False)),  # one episode in two samples counts once
        ([valid("a"), aborted(), valid("b")], 2, None, (GROUP_HAS_ABORTED, False)),
        ([valid("a"), Sample(metadata={"instance_id": "t1"})], 2, None, ("nemogym_missing_record", False)),
    ],
    ids=["all-valid", "salvaged", "too-few-valid", "min-0", "min-over-seen", "min-over-size", "per-episode",
         "aborted", "no-record"],
)  # fmt: skip
def test_group_verdict(
    samples: list[Sample], min_valid: int, group_size: int | None, verdict: tuple[Any, bool]
) -> None:
    assert group_verdict(samples, min_valid, group_size) == verdict


# -- reward_post_process ---------------------------------------------------------------------------


class MilesNormaliser:
    """Stands in for Miles' ``_post_process_rewards``: raw rewards, minus the batch's mean."""

    def __init__(self) -> None:
        self.batches: list[list[float]] = []

    def __call__(self, args: Any, samples: list[Sample], _: Any) -> tuple[list[float], list[float]]:
        rewards = [float(sample.reward or 0.0) for sample in samples]
        self.batches.append(rewards)
        mean = sum(rewards) / len(rewards)
        return rewards, [reward - mean for reward in rewards]


def stand_in_for_miles(monkeypatch: pytest.MonkeyPatch) -> MilesNormaliser:
    stand_in = MilesNormaliser()
    monkeypatch.setattr(groups, "_miles_post_process", lambda: stand_in)
    return stand_in


def test_failed_episodes_get_zero_loss_and_each_group_is_normalised_over_its_valid_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    normaliser = stand_in_for_miles(monkeypatch)
    samples = [valid("a", reward=1.0), failed("b"), valid("c", reward=0.0), valid("d", reward=3.0, group=1),
               valid("e", reward=1.0, group=1)]  # fmt: skip
    raw, normalised = groups.reward_post_process(None, samples)
    assert normaliser.batches == [[1.0, 0.0], [3.0, 1.0]]  # one call per group, its valid samples alone
    assert raw == [1.0, 0.0, 0.0, 3.0, 1.0]
    assert normalised == [0.5, 0.0, -0.5, 1.0, -1.0]
    assert [sample.remove_sample for sample in samples] == [False, True, False, False, False]
    assert groups.zero_loss_samples(samples) == 1


def test_without_failed_episodes_it_is_miles_default_over_the_whole_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    normaliser = stand_in_for_miles(monkeypatch)
    samples = [valid("a", reward=1.0), valid("b", reward=0.0, group=1)]
    assert groups.reward_post_process(None, samples) == ([1.0, 0.0], [0.5, -0.5])
    assert normaliser.batches == [[1.0, 0.0]]


def test_a_sample_without_a_group_index_is_refused_naming_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_for_miles(monkeypatch)
    samples = [valid("a"), failed("b")]
    samples[0].group_index = None
    with pytest.raises(ValueError, match="NEMO_GYM_MIN_VALID_PER_GROUP=0"):
        groups.reward_post_process(None, samples)


def test_without_miles_the_hook_says_what_to_remove(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "miles", None)
    groups._miles_post_process.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="Remove --custom-reward-post-process-path"):
            groups.reward_post_process(None, [valid("a")])
    finally:
        groups._miles_post_process.cache_clear()


# -- holding failed episodes -----------------------------------------------------------------------


def test_held_episodes_are_claimed_oldest_first_per_task_and_bounded() -> None:
    held = HeldEpisodes(limit=3)
    for task, episode in [("t1", "e1"), ("t2", "e2"), ("t1", "e3"), ("t1", "e4")]:
        held.hold(task, episode, {"episode": episode})
    assert held_count(held) == 3  # e1, the oldest, made room
    held.release("t2", "e2")
    assert held.claim("t2") is None
    assert [held.claim("t1"), held.claim("t1"), held.claim("t1")] == [{"episode": "e3"}, {"episode": "e4"}, None]
    held.hold("t3", "e5", {})
    assert held.clear() == 1 and held_count(held) == 0


@pytest.mark.parametrize(
    ("kind", "mask", "metadata", "aborted", "kept"),
    [
        ("transport_peer_drop", True, {}, False, True),
        (POLICY_TIMEOUT, False, {}, False, True),  # a /run may time out before its first turn
        (CANCELLED, True, {}, True, False),  # our abort: never given back, the abort forgot it
        (CANCELLED, True, {}, False, True),  # the server's own verdict: a failed episode like any other
        ("transport_peer_drop", True, eval_overrides("held-out"), False, False),  # eval samples are not trained
        (None, False, {}, False, False),
    ],
)
def test_only_a_failed_train_episode_is_held(
    kind: str | None, mask: bool, metadata: dict[str, Any], aborted: bool, kept: bool
) -> None:
    sample = failed("e1", **metadata) if kind else valid("e1", **metadata)
    result = dict(sample.metadata)
    result["nemogym"] = {**result["nemogym"], "failure_kind": kind, "mask_sample": mask}
    held = HeldEpisodes()
    groups.hold_failed_episode(held, Task.of({"instance_id": "t1", **metadata}), result, aborted=aborted)
    assert held_count(held) == int(kept)


def test_an_aborted_sample_gets_its_held_episode_as_a_zero_loss_sample() -> None:
    held = HeldEpisodes()
    lost = failed("e-lost")
    groups.hold_failed_episode(held, Task.of({"instance_id": "t1"}), lost.metadata, aborted=False)
    returned = failed("e-back", "t2")
    groups.hold_failed_episode(held, Task.of({"instance_id": "t2"}), returned.metadata, aborted=False)
    group = [valid("e-ok"), aborted("t1"), aborted("t9"), returned]
    assert groups.recover_failed_episodes(held, group) == 1
    recovered, unknown = group[1], group[2]
    assert recovered.metadata["nemogym"]["episode_id"] == "e-lost" and recovered.metadata["instance_id"] == "t1"
    assert (recovered.tokens, recovered.response_length, recovered.loss_mask) == ([11, 12], 1, [0])
    assert (recovered.rollout_log_probs, recovered.weight_versions) == ([0.0], ["3"])
    assert (recovered.remove_sample, recovered.status, recovered.reward) == (True, Status.FAILED, 0.0)
    assert unknown.status is Status.ABORTED and "nemogym" not in unknown.metadata  # Miles' own abort: as it was
    assert held_count(held) == 0  # t2's came back with its sample: released
    assert group_verdict(group[:2], 2, 2) == ("nemogym_transport_peer_drop", False)  # trained only with 2 valid


def test_a_recovered_policy_timeout_counts_as_a_sample_trained_with_zero_loss() -> None:
    # Valid (its reward joins the group's), but its tokens are a sibling's: never trained.
    held = HeldEpisodes()
    result = dict(valid("e-late").metadata)
    result["nemogym"] = {**result["nemogym"], "failure_kind": POLICY_TIMEOUT, "mask_sample": False}
    groups.hold_failed_episode(held, Task.of({"instance_id": "t1"}), result, aborted=False)
    group = [valid("e-ok"), aborted("t1")]
    assert groups.recover_failed_episodes(held, group) == 1
    assert group[1].loss_mask == [0] and groups.zero_loss_samples(group) == 1


def test_no_valid_sibling_no_recovery_but_the_episode_leaves_with_its_group() -> None:
    held = HeldEpisodes()
    groups.hold_failed_episode(held, Task.of({"instance_id": "t1"}), failed("e1").metadata, aborted=False)
    group = [failed("e2", "t2"), aborted("t1")]
    assert groups.recover_failed_episodes(held, group) == 0
    assert group[1].status is Status.ABORTED and group[1].metadata["nemogym"]["episode_id"] == "e1"
    assert held_count(held) == 0  # never given to a later group of t1 (fully async never clears the holding)
    assert group_verdict(group, 1, 2) == (GROUP_HAS_ABORTED, False)


# -- the group filter ---------------------------------------------------------------------------


@dataclass
class Args:
    custom_reward_post_process_path: str | None = POST_PROCESS_PATH
    n_samples_per_prompt: int | None = 4


class Unreadable:
    """A sample whose metadata cannot be read."""

    @property
    def metadata(self) -> dict[str, Any]:
        raise ValueError("corrupted")


def test_a_group_of_valid_episodes_is_kept_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "miles", None)  # without Miles: our stand-in of its output type
    groups._output_type.cache_clear()
    out = groups.check_episode_group(Args(), [valid(e) for e in "abcd"])
    assert (type(out), out.keep, out.reason) == (groups.FilterOutput, True, None)
    tally = current().ledger.drain()
    assert (tally.groups_dropped, tally.groups_salvaged) == (0, 0)


def test_a_partly_failed_group_is_salvaged_when_the_hook_is_wired() -> None:
    group = [valid("a"), valid("b"), failed("c"), failed("d")]
    assert groups.check_episode_group(Args(), group).keep is True
    assert groups.judge_group(Args(), group) == (None, True)
    assert current().ledger.drain().groups_salvaged == 1  # judge_group records nothing; the filter once


def test_without_the_hook_a_partly_failed_group_is_dropped_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    group = [valid("a"), valid("b"), valid("c"), failed("d", kind="agent_timeout")]
    with caplog.at_level(logging.WARNING, logger="miles_nemogym.groups"):
        outs = [groups.check_episode_group(Args(custom_reward_post_process_path=None), group) for _ in range(2)]
    assert [(out.keep, out.reason) for out in outs] == [(False, "nemogym_agent_timeout")] * 2
    assert [r.getMessage().count(POST_PROCESS_PATH) for r in caplog.records] == [1]
    assert current().ledger.drain().groups_dropped == 2


def test_the_group_size_miles_asked_for_sets_the_bar(use_settings: UseSettings) -> None:
    use_settings(NEMO_GYM_MIN_VALID_PER_GROUP="3")
    seen = [valid("a"), valid("b"), failed("c")]  # 3 of the 4 asked for came back
    assert groups.judge_group(Args(n_samples_per_prompt=4), seen) == ("nemogym_transport_peer_drop", False)
    assert groups.judge_group(Args(n_samples_per_prompt=2), seen) == (None, True)


def test_an_unreadable_group_is_dropped_not_raised() -> None:
    out = groups.check_episode_group(Args(), [valid("a"), Unreadable()])
    assert (out.keep, out.reason) == (False, "nemogym_unreadable_record")


def test_a_failed_episode_held_for_its_aborted_sample_is_given_back_before_the_verdict() -> None:
    lost = failed("e-lost", "t9")
    current().held.hold("t9", "e-lost", lost.metadata)
    group = [valid("a"), valid("b"), valid("c"), aborted("t9")]
    assert groups.check_episode_group(Args(), group).keep is True
    assert group[3].metadata["nemogym"]["episode_id"] == "e-lost" and held_count(current().held) == 0
    unheld = [valid("a"), valid("b"), valid("c"), aborted("t8")]  # Miles' own abort: nothing to give back
    assert groups.check_episode_group(Args(), unheld).reason == "group_has_aborted"


def test_no_reason_to_stop_by_default() -> None:
    assert groups.stop_reason(current().settings) is None
    groups.check_run(current().settings)


async def test_a_failure_streak_stops_the_run_and_what_is_in_flight(use_settings: UseSettings) -> None:
    use_settings(NEMO_GYM_MAX_FAILURE_STREAK="3")
    for _ in range(2):
        current().ledger.record_episode("transport_peer_drop")
    assert groups.stop_reason(current().settings) is None
    current().ledger.record_episode("agent_timeout")
    reason = groups.stop_reason(current().settings)
    assert reason is not None and reason.startswith("3 NeMo-Gym episodes in a row failed")
    started = asyncio.Event()

    async def waits(_: Any) -> Any:
        started.set()
        await asyncio.Event().wait()
        return failure("x", "not reached")

    running = asyncio.create_task(current().in_flight.run(waits))
    await asyncio.wait_for(started.wait(), 10)
    with pytest.raises(RunStopped, match="NEMO_GYM_MAX_FAILURE_STREAK=3"):
        groups.check_episode_group(Args(), [valid(e) for e in "abcd"])
    assert (await asyncio.wait_for(running, 10)).record.failure_kind == "cancelled"
    current().ledger.record_episode(None)  # a valid episode ends the streak
    assert groups.stop_reason(current().settings) is None


async def test_an_outage_past_its_timeout_stops_the_run() -> None:
    circuit = current().circuits.for_url(f"http://127.0.0.1:{free_port()}", "NEMO_GYM_URL")
    circuit.trip(0.2, "transport_unreachable", "refused")
    assert groups.stop_reason(current().settings) is None  # open, not given up: episodes wait
    gave_up, waited = await asyncio.wait_for(circuit.wait(), 10)
    assert gave_up == "transport_unreachable" and waited < 5
    with pytest.raises(RunStopped, match=r"could not be reached .*NEMO_GYM_OUTAGE_TIMEOUT=0\.2s"):
        groups.check_run(current().settings)
