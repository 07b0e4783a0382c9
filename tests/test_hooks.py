"""Reward hook, group filter and rollout metrics on Miles-shaped samples."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym import agent, groups, metrics
from miles_nemogym.episode.record import failure
from miles_nemogym.runtime import Tally, current
from tests.support.clean_env import clean_environ
from tests.support.runtime_settings import UseSettings
from tests.support.samples import Sample, Status

# The hooks run on the settings given here (defaults unless a test gives one), never the shell's.
pytestmark = pytest.mark.usefixtures("use_settings")


def sample_from(outcome_meta: dict[str, Any], status: Status = Status.COMPLETED, **extra: Any) -> Sample:
    return Sample(metadata={"instance_id": "x", **outcome_meta, **extra}, status=status)


def masked(kind: str = "transport_peer_drop", episode: str = "f1") -> dict[str, Any]:
    outcome = failure(kind, "x")
    outcome.record.episode_id = episode
    outcome.record.elapsed_s = 5.0
    outcome.record.attempts = 1
    return outcome.to_metadata()


async def test_reward_single_and_batch_in_order(graded: list[dict[str, Any]]) -> None:
    samples = [sample_from(m) for m in graded]
    assert await agent.reward_func(None, samples) == [m["reward"] for m in graded]
    assert await agent.reward_func(None, samples[0]) == graded[0]["reward"]
    assert await agent.reward_func(None, []) == []


async def test_masked_sample_scores_zero_even_with_a_reward() -> None:
    meta = masked()
    meta["reward"] = 1.0
    assert await agent.reward_func(None, sample_from(meta)) == 0.0


@pytest.mark.parametrize(
    ("value", "problem"), [(None, "missing_reward"), ("1.0", "non_numeric_reward"), (math.inf, "non_finite_reward")]
)
async def test_missing_or_invalid_reward_is_zero_and_counted(value: Any, problem: str) -> None:
    before = current().reward_problems[problem]
    meta = {"reward": value} if value is not None else {}
    assert await agent.reward_func(None, Sample(metadata=meta)) == 0.0
    assert current().reward_problems[problem] == before + 1


async def test_partial_credit_mode(use_settings: UseSettings) -> None:
    def meta(f2p: tuple[int, int], p2p: tuple[int, int], resolved: bool = False, r: float = 0.0) -> Sample:
        record = {"mask_sample": False, "resolved": resolved,
                  "fail_to_pass": {"passed": f2p[0], "failed": f2p[1]},
                  "pass_to_pass": {"passed": p2p[0], "failed": p2p[1]}}  # fmt: skip
        return Sample(metadata={"reward": r, "nemogym": record})

    cases = [meta((1, 3), (10, 0)), meta((1, 3), (9, 1)), meta((4, 0), (10, 0), True, 1.0), meta((0, 0), (3, 0))]
    assert await agent.reward_func(None, cases) == [0.0, 0.0, 1.0, 0.0]  # binary default
    use_settings(NEMO_GYM_REWARD_MODE="partial")  # a new run with it
    assert await agent.reward_func(None, cases) == [0.25, 0.0, 1.0, 0.0]


def test_filter_keeps_a_group_of_valid_episodes(graded: list[dict[str, Any]]) -> None:
    out = groups.check_episode_group(None, [sample_from(m) for m in graded])
    assert (out.keep, out.reason) == (True, None)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (sample_from(masked("agent_run_error")), "nemogym_agent_run_error"),
        (sample_from(masked("miles_nemogym:invalid_request")), "nemogym_miles_nemogym_invalid_request"),
        (Sample(metadata={"instance_id": "x"}), "nemogym_missing_record"),
        (sample_from({}, status=Status.ABORTED), "group_has_aborted"),
    ],
)
def test_with_min_valid_zero_the_filter_drops_a_group_with_one_bad_sample(
    graded: list[dict[str, Any]], bad: Sample, reason: str, use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_MIN_VALID_PER_GROUP="0")  # drop on any failure (salvage: test_integrity)
    group = [sample_from(m) for m in graded[:3]] + [bad]
    out = groups.check_episode_group(None, group)
    assert (out.keep, out.reason) == (False, reason)
    # Miles v2 passes a list of per-sample lists: same decision.
    nested = groups.check_episode_group(None, [[s] for s in group])
    assert (nested.keep, nested.reason) == (False, reason)


def test_metrics_over_distinct_episodes(graded: list[dict[str, Any]]) -> None:
    samples = [sample_from(m) for m in graded]
    samples.append(sample_from(graded[0]))  # one episode split into two samples
    samples.append(sample_from(masked("agent_run_error", "f1")))
    samples.append(sample_from(masked("transport_peer_drop", "f2")))
    samples.append(Sample(metadata={}))
    never_sent = failure("miles_nemogym:invalid_request", "bad row").to_metadata()
    never_sent["nemogym"]["episode_id"] = "f3"
    samples.append(sample_from(never_sent))
    m = metrics.rollout_metrics(samples, Tally())
    assert m["nemogym/samples"] == 10 and m["nemogym/samples_without_record"] == 1
    assert m["nemogym/episodes_trained"] == 8  # five graded (one in two samples), three failed
    # Counts and failure rates have one source, the ledger (here empty): never the samples.
    assert m["nemogym/episodes"] == 0 and not any(key.startswith("nemogym/failure_rate") for key in m)
    assert m["nemogym/resolve_rate"] == pytest.approx(1 / 5)  # over valid episodes only
    assert m["nemogym/patch_applied_rate"] == 1.0  # the five real patches all applied
    assert m["nemogym/fail_to_pass_fraction_mean"] == pytest.approx(1 / 5)  # scikit-learn's 1 of 1; the rest 0
    assert m["nemogym/episode_time_max"] == 50.0
    # nearest rank 4 of 5,5,10,20,30,40,50: the never-sent row has no duration to count
    assert m["nemogym/episode_time_p50"] == 20.0
    assert m["nemogym/episode_time_p95"] == 50.0
    assert m["nemogym/turns_mean"] == pytest.approx((5 + 5 + 10 + 20 + 22) / 5)  # the five real episodes
    assert m["nemogym/tool_calls_mean"] == pytest.approx((8 + 6 + 24 + 31 + 60) / 5)


def test_a_session_server_v2_episode_of_several_samples_is_one_trained_episode(graded: list[dict[str, Any]]) -> None:
    # Miles' session server v2 returns one list per episode, one sample per linear trajectory,
    # each carrying the agent's dict; a failed episode's list as well.
    group = [[sample_from(graded[0]), sample_from(graded[0]), sample_from(graded[0])], [sample_from(graded[1])],
             [sample_from(masked("agent_run_error", "f1")), sample_from(masked("agent_run_error", "f1"))]]  # fmt: skip
    m = metrics.rollout_metrics([group], Tally())
    assert (m["nemogym/samples"], m["nemogym/episodes_trained"], m["nemogym/samples_zero_loss"]) == (6, 3, 2)


def test_log_rollout_without_miles_logs_the_steps_metrics_once_and_drains_the_ledger(
    graded: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "miles", None)  # Miles' tracking is not importable
    current().ledger.record_episode(None)
    current().ledger.record_episode("transport_unreachable")
    with caplog.at_level(logging.INFO, logger="miles_nemogym.metrics"):
        assert metrics.log_rollout(3, None, [sample_from(m) for m in graded], {}, 1.0) is False  # Miles logs too
        metrics.log_rollout(4, None, [], {}, 1.0)
    first, second = [r.getMessage() for r in caplog.records if "nemogym metrics" in r.getMessage()]
    assert first.startswith("rollout/step 3 nemogym metrics (Miles tracking not importable): {")
    assert "'nemogym/samples': 5.0" in first and "'nemogym/episodes': 2.0" in first
    assert "'nemogym/episodes': 0.0" in second  # the step's episodes were counted once, at step 3


def test_metrics_on_empty_rollout() -> None:
    assert metrics.rollout_metrics([], Tally()) == {
        "nemogym/samples": 0.0, "nemogym/samples_without_record": 0.0, "nemogym/samples_zero_loss": 0.0,
        "nemogym/episodes_trained": 0.0, "nemogym/episodes": 0.0, "nemogym/episodes_cancelled": 0.0,
        "nemogym/groups_salvaged": 0.0, "nemogym/groups_dropped": 0.0, "nemogym/outage_wait_s": 0.0,
    }  # fmt: skip


def _install_fake_miles(monkeypatch: pytest.MonkeyPatch, modules: dict[str, dict[str, Any]]) -> None:
    """Put minimal modules named like Miles' into sys.modules (Miles is not installable here)."""
    import sys
    import types

    for name in ("miles", "miles.rollout", "miles.rollout.filter_hub", "miles.utils", *modules):
        module = types.ModuleType(name)
        for attr, value in modules.get(name, {}).items():
            setattr(module, attr, value)
        monkeypatch.setitem(sys.modules, name, module)


def test_filter_returns_miles_type_when_miles_is_importable(tmp_path: Path) -> None:
    """In a fresh interpreter where ``miles`` imports (a stand-in package), as Miles loads the hook."""
    hub = tmp_path / "miles" / "rollout" / "filter_hub"
    hub.mkdir(parents=True)
    for package in (hub.parents[1], hub.parent, hub):
        (package / "__init__.py").write_text("")
    (hub / "base_types.py").write_text(
        "from dataclasses import dataclass\n\n\n@dataclass\nclass DynamicFilterOutput:\n"
        "    keep: bool\n    reason: str | None = None\n"
    )
    script = (
        "from miles_nemogym import groups\n"
        "from tests.support.samples import Sample\n"
        "out = groups.check_episode_group(None, [Sample(metadata={})])\n"
        "print(type(out).__module__, type(out).__name__, out.keep, out.reason)\n"
    )
    env = clean_environ(PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    expected = ["miles.rollout.filter_hub.base_types", "DynamicFilterOutput", "False", "nemogym_missing_record"]
    assert done.stdout.split() == expected


def test_log_rollout_logs_through_miles_tracking(monkeypatch: pytest.MonkeyPatch, graded: list[dict[str, Any]]) -> None:
    import types

    calls: list[tuple[Any, dict[str, Any], str]] = []
    tracking = types.SimpleNamespace(log=lambda args, d, step_key: calls.append((args, dict(d), step_key)))
    _install_fake_miles(
        monkeypatch,
        {
            "miles.utils.tracking_utils": {"tracking": tracking},
            "miles.utils.metric_utils": {"compute_rollout_step": lambda args, rollout_id: rollout_id * 10},
        },
    )
    args = object()
    assert metrics.log_rollout(7, args, [sample_from(m) for m in graded], {}, 2.0) is False
    ((got_args, logged, step_key),) = calls
    assert got_args is args and step_key == "rollout/step" and logged["rollout/step"] == 70
    assert logged["nemogym/resolve_rate"] == pytest.approx(0.2)
