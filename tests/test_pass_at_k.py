"""``nemogym-eval/<set>/*``: pass@k over valid episodes, grouped by instance, failures set aside."""

from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from miles_nemogym import metrics
from miles_nemogym.episode.record import pass_at_k
from miles_nemogym.metrics import eval_set_metrics
from miles_nemogym.runtime import Tally, current
from tests.support.samples import Sample, Status

P = "nemogym-eval/verified/"


def sample(
    instance: str, episode: str, *, resolved: bool = False, kind: str | None = None, repo: str = "a/b"
) -> Sample:
    record: dict[str, Any] = {"episode_id": episode, "instance_id": instance, "mask_sample": kind is not None}
    if kind is None:
        record.update(
            status="ok",
            resolved=resolved,
            patch_applied=True,
            fail_to_pass={"passed": int(resolved), "failed": 1 - int(resolved)},
        )
    else:
        record.update(status="failed", failure_kind=kind)
    return Sample(metadata={"instance_id": instance, "repo": repo, "nemogym": record})


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(3, 0, 2) == 0.0
    with pytest.raises(ValueError, match="pass@2 needs at least 2"):
        pass_at_k(1, 1, 2)


def test_pass_at_k_is_logged_for_each_power_of_two_up_to_k_and_k_itself() -> None:
    # One instance, 12 episodes, 3 resolved; k = 12 (a benchmark's repeats).
    samples = [sample("x", f"e{i}", resolved=i < 3) for i in range(12)]
    got = eval_set_metrics("verified", samples, 12, Tally())
    assert sorted(key for key in got if "/pass@" in key and key.count("/") == 2) == [
        P + f"pass@{k}" for k in ("1", "12", "2", "4", "8")
    ]
    for k in (2, 4, 8, 12):
        assert got[P + f"pass@{k}"] == pytest.approx(pass_at_k(12, 3, k))
    assert P + "pass@16" not in got


def test_masked_episodes_are_set_aside_not_counted_as_policy_failures() -> None:
    samples = [
        # x: 4 valid, 1 resolved.
        sample("x", "x1", resolved=True), sample("x", "x2"), sample("x", "x3"), sample("x", "x4"),
        # y: 2 valid (both resolved) + 2 crashed: one short of k=3 after the crashes.
        sample("y", "y1", resolved=True, repo="c/d"), sample("y", "y2", resolved=True, repo="c/d"),
        sample("y", "y3", kind="agent_run_error", repo="c/d"),
        sample("y", "y4", kind="transport_peer_drop", repo="c/d"),
        # z: 3 valid, none resolved; one episode split into two samples (session server v2).
        sample("z", "z1"), sample("z", "z1"), sample("z", "z2"), sample("z", "z3"),
        # w: its only episode crashed: no measurement, short of k, not a 0 in pass@1.
        sample("w", "w1", kind="agent_run_error"),
    ]  # fmt: skip
    # The ledger saw the same 12 episodes (the agent function records each one).
    tally = Tally(episodes=12, failures=Counter({"agent_run_error": 2, "transport_peer_drop": 1}))
    got = eval_set_metrics("verified", samples, 3, tally)
    assert got[P + "samples"] == 13.0
    assert got[P + "episodes"] == 12.0
    assert got[P + "episodes_valid"] == 9.0
    assert got[P + "episodes_masked"] == 3.0
    assert got[P + "masked_fraction"] == pytest.approx(3 / 12)
    assert got[P + "instances"] == 4.0
    assert got[P + "masked/agent_run_error"] == 2.0 and got[P + "masked/transport_peer_drop"] == 1.0
    # pass@1 per instance over valid episodes: x 1/4, y 2/2, z 0/3.
    assert got[P + "pass@1"] == pytest.approx((0.25 + 1.0 + 0.0) / 3)
    # pass@3 over instances with >= 3 valid episodes (x, z); y and w are short of k.
    assert got[P + "pass@3"] == pytest.approx((pass_at_k(4, 1, 3) + 0.0) / 2)
    assert got[P + "instances_short_of_k"] == 2.0
    assert got[P + "resolve_rate"] == pytest.approx(3 / 9)
    assert got[P + "patch_applied_rate"] == 1.0
    assert got[P + "fail_to_pass_fraction_mean"] == pytest.approx(3 / 9)
    assert got[P + "resolve_rate/a__b"] == pytest.approx(1 / 7)
    assert got[P + "resolve_rate/c__d"] == 1.0


def test_counts_come_from_the_ledger_which_also_saw_record_less_episodes() -> None:
    # Miles returned one crashed episode without our record: only the ledger saw it.
    tally = Tally(episodes=3)
    tally.failures["agent_run_error"] = 1
    tally.failures["transport_unreachable"] = 1
    got = eval_set_metrics(
        "verified", [sample("x", "x1", resolved=True), sample("x", "x2", kind="agent_run_error")], 1, tally
    )
    assert got[P + "episodes"] == 3.0 and got[P + "episodes_masked"] == 2.0
    assert got[P + "masked_fraction"] == pytest.approx(2 / 3)
    assert got[P + "masked/transport_unreachable"] == 1.0
    assert got[P + "pass@1"] == 1.0
    assert P + "pass@1" in got and not any(key.startswith(P + "pass@2") for key in got)


def test_log_eval_drains_each_sets_tally_and_returns_false() -> None:
    current().ledger.record_episode(None, "eval", "verified")
    current().ledger.record_episode("agent_run_error", "eval", "verified")
    current().ledger.record_episode(None, "train")
    args = SimpleNamespace(
        eval_datasets=[SimpleNamespace(name="verified", n_samples_per_eval_prompt=2)], n_samples_per_eval_prompt=1
    )
    data = {
        "verified": {
            "rewards": [1.0, 0.0],
            "samples": [sample("x", "x1", resolved=True), sample("x", "x2", kind="agent_run_error")],
        }
    }
    assert metrics.eval_k(args, "verified") == 2
    assert metrics.log_eval(4, args, data, {}) is False
    assert current().ledger.drain("eval", "verified").episodes == 0  # drained by log_eval
    assert current().ledger.drain("train").episodes == 1  # train is not touched by eval


def test_an_instance_whose_episodes_all_came_back_without_a_record_is_short_of_k() -> None:
    # y's two episodes failed before their first policy call (a sandbox that never started): Miles
    # returns eval samples ABORTED without our dict, and no filter gives the record back in eval.
    lost = [Sample(metadata={"instance_id": "y", "repo": "c/d"}, status=Status.ABORTED) for _ in range(2)]
    samples = [sample("x", "x1", resolved=True), sample("x", "x2"), *lost]
    tally = Tally(episodes=4, failures=Counter({"transport_peer_drop": 2}))
    got = eval_set_metrics("verified", samples, 2, tally)
    assert got[P + "instances"] == 2.0  # y is an instance of the set, with no measurement
    assert got[P + "instances_short_of_k"] == 1.0
    assert got[P + "pass@1"] == 0.5 and got[P + "pass@2"] == 1.0  # over x alone, not a 0 for y
    assert got[P + "swe/instances"] == 2.0 and got[P + "swe/instances_short_of_k"] == 1.0
