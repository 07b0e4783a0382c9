"""``salvage`` on its own: the group verdict, the reward post-process hook (Miles' normaliser
stood in for), and holding a failed episode until its ABORTED sample comes back."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from miles_nemogym import failure_kinds as fk
from miles_nemogym import salvage
from miles_nemogym.episode.record import Task, eval_overrides
from miles_nemogym.salvage import GROUP_HAS_ABORTED, HeldEpisodes, group_verdict
from tests.support.salvage_samples import aborted, failed, valid
from tests.support.samples import Sample, Status

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
    monkeypatch.setattr(salvage, "_miles_post_process", lambda: stand_in)
    return stand_in


def test_failed_episodes_get_zero_loss_and_each_group_is_normalised_over_its_valid_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    normaliser = stand_in_for_miles(monkeypatch)
    samples = [valid("a", reward=1.0), failed("b"), valid("c", reward=0.0), valid("d", reward=3.0, group=1),
               valid("e", reward=1.0, group=1)]  # fmt: skip
    raw, normalised = salvage.reward_post_process(None, samples)
    assert normaliser.batches == [[1.0, 0.0], [3.0, 1.0]]  # one call per group, its valid samples alone
    assert raw == [1.0, 0.0, 0.0, 3.0, 1.0]
    assert normalised == [0.5, 0.0, -0.5, 1.0, -1.0]
    assert [sample.remove_sample for sample in samples] == [False, True, False, False, False]
    assert salvage.zero_loss_samples(samples) == 1


def test_without_failed_episodes_it_is_miles_default_over_the_whole_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    normaliser = stand_in_for_miles(monkeypatch)
    samples = [valid("a", reward=1.0), valid("b", reward=0.0, group=1)]
    assert salvage.reward_post_process(None, samples) == ([1.0, 0.0], [0.5, -0.5])
    assert normaliser.batches == [[1.0, 0.0]]


def test_a_sample_without_a_group_index_is_refused_naming_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_for_miles(monkeypatch)
    samples = [valid("a"), failed("b")]
    samples[0].group_index = None
    with pytest.raises(ValueError, match="NEMO_GYM_MIN_VALID_PER_GROUP=0"):
        salvage.reward_post_process(None, samples)


def test_without_miles_the_hook_says_what_to_remove(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "miles", None)
    salvage._miles_post_process.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="Remove --custom-reward-post-process-path"):
            salvage.reward_post_process(None, [valid("a")])
    finally:
        salvage._miles_post_process.cache_clear()


# -- holding failed episodes -----------------------------------------------------------------------


def test_held_episodes_are_claimed_oldest_first_per_task_and_bounded() -> None:
    held = HeldEpisodes(limit=3)
    for task, episode in [("t1", "e1"), ("t2", "e2"), ("t1", "e3"), ("t1", "e4")]:
        held.hold(task, episode, {"episode": episode})
    assert len(held) == 3  # e1, the oldest, made room
    held.release("t2", "e2")
    assert held.claim("t2") is None
    assert [held.claim("t1"), held.claim("t1"), held.claim("t1")] == [{"episode": "e3"}, {"episode": "e4"}, None]
    held.hold("t3", "e5", {})
    assert held.clear() == 1 and len(held) == 0


@pytest.mark.parametrize(
    ("kind", "mask", "metadata", "kept"),
    [
        ("transport_peer_drop", True, {}, True),
        (fk.POLICY_TIMEOUT, False, {}, True),  # a /run may time out before its first turn
        (fk.CANCELLED, True, {}, False),  # never given back: the abort forgot it
        ("transport_peer_drop", True, eval_overrides("held-out"), False),  # eval samples are not trained
        (None, False, {}, False),
    ],
)
def test_only_a_failed_train_episode_is_held(
    kind: str | None, mask: bool, metadata: dict[str, Any], kept: bool
) -> None:
    sample = failed("e1", **metadata) if kind else valid("e1", **metadata)
    result = dict(sample.metadata)
    result["nemogym"] = {**result["nemogym"], "failure_kind": kind, "mask_sample": mask}
    held = HeldEpisodes()
    salvage.hold_failed_episode(held, Task.of({"instance_id": "t1", **metadata}), result)
    assert len(held) == int(kept)


def test_an_aborted_sample_gets_its_held_episode_as_a_zero_loss_sample() -> None:
    held = HeldEpisodes()
    lost = failed("e-lost")
    salvage.hold_failed_episode(held, Task.of({"instance_id": "t1"}), lost.metadata)
    returned = failed("e-back", "t2")
    salvage.hold_failed_episode(held, Task.of({"instance_id": "t2"}), returned.metadata)
    group = [valid("e-ok"), aborted("t1"), aborted("t9"), returned]
    assert salvage.recover_failed_episodes(held, group) == 1
    recovered, unknown = group[1], group[2]
    assert recovered.metadata["nemogym"]["episode_id"] == "e-lost" and recovered.metadata["instance_id"] == "t1"
    assert (recovered.tokens, recovered.response_length, recovered.loss_mask) == ([11, 12], 1, [0])
    assert (recovered.rollout_log_probs, recovered.weight_versions) == ([0.0], ["3"])
    assert (recovered.remove_sample, recovered.status, recovered.reward) == (True, Status.FAILED, 0.0)
    assert unknown.status is Status.ABORTED and "nemogym" not in unknown.metadata  # Miles' own abort: as it was
    assert len(held) == 0  # t2's came back with its sample: released
    assert group_verdict(group[:2], 2, 2) == ("nemogym_transport_peer_drop", False)  # trained only with 2 valid


def test_no_valid_sibling_no_recovery() -> None:
    held = HeldEpisodes()
    salvage.hold_failed_episode(held, Task.of({"instance_id": "t1"}), failed("e1").metadata)
    group = [failed("e2", "t2"), aborted("t1")]
    assert salvage.recover_failed_episodes(held, group) == 0
    assert group[1].status is Status.ABORTED and len(held) == 1
