"""Per-environment metrics: ``nemogym/<env>/*`` of a train rollout, ``nemogym-eval/<set>/<env>/*``
of an eval set, the ledger's counts per environment, and SWE's rates over SWE episodes only."""

from __future__ import annotations

import math
from typing import Any

import pytest

from miles_nemogym.episode.record import EpisodeRecord, pass_at_k, passed
from miles_nemogym.metrics import eval_set_metrics, rollout_metrics
from miles_nemogym.runtime import current
from tests.support.samples import Sample

P = "nemogym/"
E = "nemogym-eval/mixed/"


def env_sample(
    env: str, task: str, episode: str, reward: float = 0.0, *, kind: str | None = None, **rec: Any
) -> Sample:
    """A sample of a resources-server environment's episode, as the agent function leaves it."""
    record: dict[str, Any] = {"episode_id": episode, "instance_id": task, "environment": env}
    if kind is None:
        record.update(status="ok", mask_sample=False, server_reward=reward, **rec)
    else:
        record.update(status="failed", mask_sample=True, failure_kind=kind)
    return Sample(
        metadata={
            "nemogym_env": env,
            "nemogym_task_id": task,
            "reward": 0.0 if kind else reward,
            "nemogym": record,
        }
    )


def swe_sample(instance: str, episode: str, *, resolved: bool, kind: str | None = None, **rec: Any) -> Sample:
    record: dict[str, Any] = {"episode_id": episode, "instance_id": instance}
    if kind is None:
        record.update(status="ok", mask_sample=False, resolved=resolved, patch_applied=True, **rec)
    else:
        record.update(status="failed", mask_sample=True, failure_kind=kind)
    return Sample(metadata={"instance_id": instance, "repo": "o/r", "reward": float(resolved), "nemogym": record})


def record_in_ledger(samples: list[Sample], role: str = "train", eval_set: str | None = None) -> None:
    """What the agent function writes to the ledger for each of these episodes."""
    for s in samples:
        record = s.metadata["nemogym"]
        kind = record.get("failure_kind")
        current().ledger.record_episode(kind, role, eval_set, environment=s.metadata.get("nemogym_env", "swe"))


def test_train_metrics_per_environment_next_to_the_totals() -> None:
    samples = [
        swe_sample("a__b-1", "s1", resolved=True, turns=10, tool_calls=12),
        swe_sample("a__b-2", "s2", resolved=False, turns=20, tool_calls=30),
        env_sample("mcqa", "mcqa/1", "m1", 1.0, turns=1, tool_calls=0),
        env_sample("mcqa", "mcqa/2", "m2", 0.0, turns=1, tool_calls=0),
        env_sample("mcqa", "mcqa/3", "m3", 1.0, turns=2, tool_calls=0),
        env_sample("mcqa", "mcqa/4", "m4", kind="verifier_error"),
        env_sample("workplace_assistant", "wa/1", "w1", 0.5, turns=4, tool_calls=3),
        env_sample("workplace_assistant", "wa/2", "w2", kind="transport_unreachable"),
        env_sample("workplace_assistant", "wa/3", "w3", kind="transport_unreachable"),
    ]
    record_in_ledger(samples)
    current().ledger.record_episode("verifier_error", environment="mcqa")  # returned by Miles without our record
    current().ledger.record_episode(
        "cancelled", environment="mcqa", aborted=True
    )  # over-sampled: neither an episode nor a failure
    m = rollout_metrics(samples, current().ledger.drain())

    # Totals: every environment's episodes; SWE's rates over the two SWE episodes only.
    assert m[P + "episodes"] == 10 and m[P + "episodes_cancelled"] == 1
    assert m[P + "failure_rate"] == pytest.approx(4 / 10)
    assert m[P + "resolve_rate"] == 0.5 and m[P + "patch_applied_rate"] == 1.0
    assert m[P + "turns_mean"] == pytest.approx((10 + 20 + 1 + 1 + 2 + 4) / 6)

    assert m[P + "mcqa/episodes"] == 5 and m[P + "mcqa/episodes_valid"] == 3
    assert m[P + "mcqa/failure_rate"] == pytest.approx(2 / 5)
    assert m[P + "mcqa/failure_rate/verifier_error"] == pytest.approx(2 / 5)
    assert m[P + "mcqa/reward_mean"] == pytest.approx(2 / 3)  # over valid episodes only
    assert m[P + "mcqa/turns_mean"] == pytest.approx(4 / 3) and m[P + "mcqa/tool_calls_mean"] == 0.0

    w = P + "workplace_assistant/"
    assert (m[w + "episodes"], m[w + "episodes_valid"], m[w + "reward_mean"]) == (3, 1, 0.5)
    assert m[w + "failure_rate/transport_unreachable"] == pytest.approx(2 / 3)
    assert m[w + "turns_mean"] == 4 and m[w + "tool_calls_mean"] == 3

    assert m[P + "swe/episodes"] == 2 and m[P + "swe/episodes_valid"] == 2 and m[P + "swe/reward_mean"] == 0.5
    assert m[P + "swe/failure_rate"] == 0.0 and m[P + "swe/turns_mean"] == 15
    envs = {key.split("/")[1] for key in m if key.count("/") >= 2 and not key.startswith(P + "failure_rate/")}
    assert envs == {"swe", "mcqa", "workplace_assistant"}


def test_environment_rows_are_never_unresolved_swe_episodes() -> None:
    samples = [env_sample("mcqa", f"mcqa/{i}", f"m{i}", 1.0) for i in range(3)]
    record_in_ledger(samples)
    m = rollout_metrics(samples, current().ledger.drain())
    assert not any("resolve_rate" in key or "patch_applied" in key or "fail_to_pass" in key for key in m)
    assert m[P + "mcqa/reward_mean"] == 1.0 and P + "swe/episodes" not in m


def test_an_environment_only_in_the_ledger_still_reports_its_counts() -> None:
    current().ledger.record_episode("transport_unreachable", environment="code_gen")  # its group was dropped
    m = rollout_metrics([], current().ledger.drain())
    assert m[P + "code_gen/episodes"] == 1 and m[P + "code_gen/episodes_valid"] == 0
    assert m[P + "code_gen/failure_rate/transport_unreachable"] == 1.0
    assert P + "code_gen/reward_mean" not in m


def test_a_corrupted_environment_name_is_one_bounded_label() -> None:
    odd = env_sample("mcqa", "t/1", "x1", 1.0)
    odd.metadata["nemogym"]["environment"] = "no/such env!"
    m = rollout_metrics([odd], current().ledger.drain())
    assert m[P + "unrecognized/reward_mean"] == 1.0
    assert not any("no/such" in key for key in m)


def test_eval_pass_at_k_per_environment_within_a_set() -> None:
    samples = [
        # SWE x: 3 valid, 1 resolved.
        swe_sample("x", "x1", resolved=True), swe_sample("x", "x2", resolved=False),
        swe_sample("x", "x3", resolved=False),
        # mcqa/1: 1.0, 0.0, 1.0; mcqa/2: 0.0, 0.0 + one masked (short of k=3).
        env_sample("mcqa", "mcqa/1", "a1", 1.0), env_sample("mcqa", "mcqa/1", "a2", 0.0),
        env_sample("mcqa", "mcqa/1", "a3", 1.0),
        env_sample("mcqa", "mcqa/2", "b1", 0.0), env_sample("mcqa", "mcqa/2", "b2", 0.0),
        env_sample("mcqa", "mcqa/2", "b3", kind="verifier_error"),
        # xlam/1: partial credit is not a pass (0.5 twice, 1.0 once).
        env_sample("xlam_fc", "xlam/1", "c1", 0.5), env_sample("xlam_fc", "xlam/1", "c2", 0.5),
        env_sample("xlam_fc", "xlam/1", "c3", 1.0),
    ]  # fmt: skip
    record_in_ledger(samples, "eval", "mixed")
    got = eval_set_metrics("mixed", samples, 3, current().ledger.drain("eval", "mixed"))

    assert got[E + "episodes"] == 12 and got[E + "episodes_masked"] == 1
    assert got[E + "instances"] == 4 and got[E + "instances_short_of_k"] == 1
    # The set's pass@1: x 1/3, mcqa/1 2/3, mcqa/2 0/2, xlam/1 1/3.
    assert got[E + "pass@1"] == pytest.approx((1 / 3 + 2 / 3 + 0 + 1 / 3) / 4)
    assert got[E + "pass@3"] == pytest.approx((1.0 + 1.0 + 1.0) / 3)
    assert got[E + "resolve_rate"] == pytest.approx(1 / 3)  # SWE episodes only
    assert got[E + "resolve_rate/o__r"] == pytest.approx(1 / 3)

    assert got[E + "mcqa/episodes"] == 6 and got[E + "mcqa/episodes_valid"] == 5
    assert got[E + "mcqa/instances"] == 2 and got[E + "mcqa/instances_short_of_k"] == 1
    assert got[E + "mcqa/pass@1"] == pytest.approx((2 / 3 + 0) / 2)
    assert got[E + "mcqa/pass@3"] == pytest.approx(pass_at_k(3, 2, 3))  # only mcqa/1 has 3 valid
    assert got[E + "mcqa/reward_mean"] == pytest.approx(2 / 5)
    assert got[E + "xlam_fc/pass@1"] == pytest.approx(1 / 3)
    assert got[E + "xlam_fc/reward_mean"] == pytest.approx(2 / 3)
    assert got[E + "swe/pass@1"] == pytest.approx(1 / 3) and got[E + "swe/pass@3"] == 1.0
    assert E + "mcqa/resolve_rate" not in got and E + "swe/episodes_valid" in got


def test_environment_rows_are_grouped_by_their_task_id_when_the_record_has_none() -> None:
    samples = [env_sample("mcqa", "mcqa/1", f"a{i}", float(i == 0)) for i in range(2)]
    for s in samples:
        del s.metadata["nemogym"]["instance_id"]
    got = eval_set_metrics("mixed", samples, 2, current().ledger.drain("eval", "mixed"))
    assert got[E + "mcqa/instances"] == 1 and got[E + "mcqa/pass@2"] == 1.0


def test_the_ledger_counts_per_environment_and_defaults_to_swe() -> None:
    current().ledger.record_episode(None)  # the existing call, unchanged
    current().ledger.record_episode("agent_run_error", "train", None, 2.0)
    current().ledger.record_episode(None, environment="mcqa")
    current().ledger.record_episode("verifier_error", environment="mcqa")
    current().ledger.record_episode(None, "eval", "held", environment="mcqa")
    tally = current().ledger.drain()
    assert tally.episodes == 4 and tally.outage_wait_s == 2.0
    assert set(tally.environments) == {"swe", "mcqa"}
    assert tally.environments["swe"].episodes == 2 and dict(tally.environments["swe"].failures) == {
        "agent_run_error": 1
    }
    assert tally.environments["mcqa"].episodes == 2 and dict(tally.environments["mcqa"].failures) == {
        "verifier_error": 1
    }
    assert current().ledger.drain("eval", "held").environments["mcqa"].episodes == 1


@pytest.mark.parametrize(
    ("reward", "expected"),
    [(1.0, True), (1, True), (2.5, True), (0.999, False), (0.0, False), (-1.0, False), (True, False),
     (math.nan, False), (math.inf, False), (None, False), ("1.0", False)],
)  # fmt: skip
def test_an_environment_episode_passes_with_full_credit(reward: Any, expected: bool) -> None:
    assert passed(EpisodeRecord(status="ok", environment="mcqa"), reward) is expected
    # The one rule sets aside a masked episode and reads a SWE episode's resolution, not its reward.
    assert passed(EpisodeRecord(status="failed", mask_sample=True, environment="mcqa"), reward) is False
    assert passed(EpisodeRecord(status="ok", resolved=expected), 0.0) is expected
