"""Miles rollout and eval log functions: ``nemogym/*`` and ``nemogym-eval/<set>/*`` metrics,
each also per environment (``nemogym/<env>/*``, ``nemogym-eval/<set>/<env>/*``).

``--custom-rollout-log-function-path miles_nemogym.metrics.log_rollout`` and
``--custom-eval-rollout-log-function-path miles_nemogym.metrics.log_eval``. What each metric
means and why: docs/using-with-miles.md and docs/episode-pipeline.md ("Metrics").
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from typing import Any

from miles_nemogym.episode.record import (
    EVAL,
    REWARD_KEY,
    SWE_ENVIRONMENT,
    TASK_ID_KEY,
    TRAIN,
    EpisodeRecord,
    SampledEpisode,
    Task,
    distinct_episodes,
    env_label,
    finite,
    flatten,
    metadata_of,
    pass_at_k,
    passed,
    percentile,
    record_of,
)
from miles_nemogym.errors import metric_label
from miles_nemogym.groups import zero_loss_samples
from miles_nemogym.runtime import Tally, current

__all__ = ["log_eval", "log_rollout"]

logger = logging.getLogger(__name__)

_PREFIX = "nemogym/"
_EVAL_PREFIX = "nemogym-eval/"

# Record fields the metrics measure: one that is unreadable is left out of its statistic
# and counted in ``corrupt_fields`` (``episode_id`` only tells episodes apart).
_MEASURED = frozenset(
    {"mask_sample", "failure_kind", "resolved", "patch_applied", "fail_to_pass", "turns", "tool_calls", "attempts"}
    | {"elapsed_s", "environment"}
)


def rollout_metrics(samples: Any, tally: Tally) -> dict[str, float]:
    """``nemogym/*`` of one rollout step: counts from the ledger's ``tally`` (it also saw dropped
    groups and record-less samples), what the step trained and its quality from the samples. Pure."""
    flat = list(flatten(samples))
    found = distinct_episodes(flat)
    metrics: dict[str, float] = {
        "samples": float(len(flat)),
        "samples_without_record": float(sum(1 for s in flat if record_of(s) is None)),
        "samples_zero_loss": float(zero_loss_samples(flat)),
        # Under session server v2 an episode may span several samples: what the step trained, in episodes.
        "episodes_trained": float(len(found)),
        **_counts(tally),
        **_quality([e.record for e in found if not e.record.mask_sample]),
    }
    # Only episodes that were sent have a duration; a row rejected before sending has none.
    times = [e.record.elapsed_s for e in found if e.record.attempts and "elapsed_s" in e.record.model_fields_set]
    if times:
        metrics["episode_time_p50"] = percentile(times, 50)
        metrics["episode_time_p95"] = percentile(times, 95)
        metrics["episode_time_max"] = max(times)
    corrupt = sum(len(e.unreadable & _MEASURED) for e in found)
    if corrupt:
        metrics["corrupt_fields"] = float(corrupt)
    metrics.update(_per_environment(found, tally))
    return {_PREFIX + key: value for key, value in metrics.items()}


def _per_environment(
    found: list[SampledEpisode], tally: Tally, eval_k: int | None = None, unrecorded: dict[str, set[str]] | None = None
) -> dict[str, float]:
    """``<env>/*`` for each environment present: counts, reward mean; for train failure rates, turns
    and tool calls, for an eval set (``eval_k``) pass@k (``unrecorded``: tasks without a record)."""
    metrics: dict[str, float] = {}
    for env, (members, share) in _environments(found, tally).items():
        valid = [e for e in members if not e.record.mask_sample]
        here = {
            "episodes": float(share.episodes),
            "episodes_valid": float(share.episodes - sum(share.failures.values())),
            **_reward_mean(valid),
        }
        if eval_k is None:
            here.update({**_failure_rates(share), **_means([e.record for e in valid])})
        else:
            here.update(_pass_rates(members, eval_k, (unrecorded or {}).get(env, set())))
        metrics.update({f"{env}/{key}": value for key, value in here.items()})
    return metrics


def _environments(found: list[SampledEpisode], tally: Tally) -> dict[str, tuple[list[SampledEpisode], Tally]]:
    """Per environment present (in the samples or the ledger), by name: its episodes and the ledger's counts."""
    members: dict[str, list[SampledEpisode]] = defaultdict(list)
    for episode in found:  # a record's name may be corrupted; the ledger's are Task.of's labels already
        members[env_label(episode.record.env)].append(episode)
    shares = tally.environments
    return {name: (members.get(name, []), shares.get(name) or Tally()) for name in sorted({*members, *shares})}


def _reward_mean(valid: list[SampledEpisode]) -> dict[str, float]:
    """The mean of the episodes' final rewards (the agent function's ``reward``) that are finite numbers."""
    return _mean("reward_mean", [r for e in valid if (r := finite(e.metadata.get(REWARD_KEY))) is not None])


def _mean(key: str, values: list[float]) -> dict[str, float]:
    return {key: sum(values) / len(values)} if values else {}


def _counts(tally: Tally) -> dict[str, float]:
    """The ledger's counts of one period; failure rates over episodes that ran (not cancelled)."""
    return {
        "episodes": float(tally.episodes),
        "episodes_cancelled": float(tally.cancelled),
        "groups_salvaged": float(tally.groups_salvaged),
        "groups_dropped": float(tally.groups_dropped),
        "outage_wait_s": round(tally.outage_wait_s, 3),
        **_failure_rates(tally),
    }


def _failure_rates(counts: Tally) -> dict[str, float]:
    if not counts.episodes:
        return {}
    metrics = {"failure_rate": sum(counts.failures.values()) / counts.episodes}
    for kind, count in sorted(counts.failures.items()):
        metrics[f"failure_rate/{metric_label(kind)}"] = count / counts.episodes
    return metrics


def _quality(valid: list[EpisodeRecord]) -> dict[str, float]:
    """Rates over valid episodes only, SWE's over SWE episodes only; ``status_rate/<kind>``: valid
    episodes whose record names a kind (their status). Shared by the rollout and the eval metrics."""
    swe = [r for r in valid if r.env == SWE_ENVIRONMENT]
    fractions = [f for f in (r.fail_to_pass.fraction for r in swe if r.fail_to_pass) if f is not None]
    metrics = {
        **_mean("resolve_rate", [float(bool(r.resolved)) for r in swe]),
        **_mean("patch_applied_rate", [float(bool(r.patch_applied)) for r in swe]),
        **_mean("fail_to_pass_fraction_mean", fractions),
    }
    for kind, count in sorted(Counter(r.failure_kind for r in valid if r.failure_kind).items()):
        metrics[f"status_rate/{metric_label(kind)}"] = count / len(valid)
    return {**metrics, **_means(valid)}


def _means(valid: list[EpisodeRecord]) -> dict[str, float]:
    return {
        **_mean("turns_mean", [float(r.turns) for r in valid if r.turns is not None]),
        **_mean("tool_calls_mean", [float(r.tool_calls) for r in valid if r.tool_calls is not None]),
    }


def log_rollout(
    rollout_id: int, args: Any, samples: Any, rollout_extra_metrics: Any = None, rollout_time: float | None = None
) -> bool:
    """Miles rollout log function: log ``nemogym/*`` metrics; returns False (Miles logs too)."""
    tally = current().ledger.drain()
    try:
        metrics: dict[str, Any] = dict(rollout_metrics(samples, tally))
    except Exception:  # never fail Miles' rollout logging over our metrics; the ledger's still count
        logger.exception("rollout %s: nemogym sample metrics could not be computed", rollout_id)
        metrics = {_PREFIX + key: value for key, value in _counts(tally).items()}
    # Fully async trains groups finished before earlier drains: the step's filing names them.
    _seal(TRAIN, rollout_id, _trained(samples) if getattr(args, "fully_async", False) else None)
    _track(args, rollout_id, metrics, "rollout/step")
    return False


def _track(args: Any, rollout_id: Any, metrics: dict[str, Any], step_key: str) -> None:
    """Log ``metrics`` through Miles' tracking at ``step_key`` (just logged where Miles is absent)."""
    try:
        from miles.utils.metric_utils import compute_rollout_step
        from miles.utils.tracking_utils import tracking
    except ImportError:
        logger.info("%s %s nemogym metrics (Miles tracking not importable): %s", step_key, rollout_id, metrics)
        return
    metrics[step_key] = compute_rollout_step(args, rollout_id)
    tracking.log(args, metrics, step_key=step_key)


def _trained(samples: Any) -> list[str] | None:
    """The episode ids among a step's samples (None, so no filing, when they cannot be read)."""
    try:
        return [e.record.episode_id for e in distinct_episodes(flatten(samples)) if e.record.episode_id]
    except Exception:
        logger.warning("episode store: the trained episodes could not be read; no filing this step", exc_info=True)
        return None


def _seal(role: str, rollout_id: Any, trained: list[str] | None = None) -> None:
    """File ``role``'s stored episodes under this step (fully async: and what it ``trained``); never raises."""
    try:
        current().stores.seal_all(role, int(rollout_id), trained)
    except Exception:
        logger.warning("episode store: could not file %s episodes under step %s", role, rollout_id, exc_info=True)


def eval_k(args: Any, name: str) -> int:
    """The number of samples per prompt of eval set ``name`` (its config, else the flag)."""
    for dataset in getattr(args, "eval_datasets", None) or []:
        if getattr(dataset, "name", None) == name and getattr(dataset, "n_samples_per_eval_prompt", None):
            return int(dataset.n_samples_per_eval_prompt)
    return int(getattr(args, "n_samples_per_eval_prompt", None) or 1)


def log_eval(rollout_id: int, args: Any, data: Any, extra_metrics: Any = None) -> bool:
    """Miles eval log function: ``nemogym-eval/<set>/*`` per set, the eval episodes filed; returns False."""
    metrics: dict[str, Any] = {}
    for name, result in (data or {}).items():
        samples = result.get("samples") if isinstance(result, dict) else None
        tally = current().ledger.drain(EVAL, str(name))
        try:
            metrics.update(eval_set_metrics(str(name), samples or [], eval_k(args, str(name)), tally))
        except Exception:  # never fail Miles' eval logging over our metrics
            logger.exception("eval %s: nemogym-eval/%s metrics could not be computed", rollout_id, name)
    _seal(EVAL, rollout_id)
    _track(args, rollout_id, metrics, "eval/step")
    return False


def eval_set_metrics(name: str, samples: Any, k: int, tally: Tally) -> dict[str, float]:
    """``nemogym-eval/<name>/*`` of one eval set: counts from the ledger's ``tally`` of the set
    (it also saw episodes Miles returned without our record), pass@k and quality from the samples."""
    flat = list(flatten(samples))
    found = distinct_episodes(flat)
    valid = [e for e in found if not e.record.mask_sample]
    masked = sum(tally.failures.values())
    metrics: dict[str, float] = {
        "samples": float(len(flat)),
        "episodes": float(tally.episodes),
        "episodes_valid": float(tally.episodes - masked),
        "episodes_masked": float(masked),
        "masked_fraction": masked / tally.episodes if tally.episodes else 0.0,
    }
    for kind, count in sorted(tally.failures.items()):
        metrics[f"masked/{metric_label(kind)}"] = float(count)

    unrecorded = _unrecorded_tasks(flat)
    metrics.update(_pass_rates(found, k, set().union(*unrecorded.values())))
    metrics.update(_reward_mean(valid))
    metrics.update(_quality([e.record for e in valid]))
    metrics.update(_resolve_rate_per_repo(valid))
    metrics.update(_per_environment(found, tally, k, unrecorded))
    return {f"{_EVAL_PREFIX}{name}/{key}": value for key, value in metrics.items()}


def _unrecorded_tasks(flat: list[Any]) -> dict[str, set[str]]:
    """Per environment, the tasks of record-less samples (eval episodes failed before their first policy call)."""
    tasks: dict[str, set[str]] = defaultdict(set)
    for sample in flat:
        if record_of(sample) is None:
            task = Task.of(metadata_of(sample))
            if task.task_id is not None:
                tasks[env_label(task.environment)].add(task.task_id)
    return tasks


def _pass_rates(found: list[SampledEpisode], k: int, unrecorded: set[str] | None = None) -> dict[str, float]:
    """pass@1 and pass@k over valid episodes, grouped by task; an instance whose episodes all failed
    (``unrecorded``: also those without a record) has no measurement: it is short of k, not a 0."""
    by_instance: dict[str, list[bool]] = defaultdict(list)
    for episode in found:
        if not episode.record.mask_sample:
            by_instance[_task(episode)].append(passed(episode.record, episode.metadata.get(REWARD_KEY)))
    instances = {_task(e) for e in found} | (unrecorded or set())
    metrics = {"instances": float(len(instances))}
    if by_instance:
        metrics["pass@1"] = sum(sum(v) / len(v) for v in by_instance.values()) / len(by_instance)
    full = {iid: v for iid, v in by_instance.items() if len(v) >= k}
    metrics["instances_short_of_k"] = float(len(instances) - len(full))
    if full:  # pass@2, pass@4, ... below k (a benchmark's 32 repeats: up to pass@32), then pass@k
        for j in [*(2**e for e in range(1, k.bit_length()) if 2**e < k), *([k] if k > 1 else [])]:
            metrics[f"pass@{j}"] = sum(pass_at_k(len(v), sum(v), j) for v in full.values()) / len(full)
    return metrics


def _task(episode: SampledEpisode) -> str:
    return str(episode.record.instance_id or episode.metadata.get(TASK_ID_KEY))


def _resolve_rate_per_repo(valid: list[SampledEpisode]) -> dict[str, float]:
    per_repo: dict[str, list[bool]] = defaultdict(list)
    for episode in valid:
        repo = episode.metadata.get("repo")
        if isinstance(repo, str) and episode.record.env == SWE_ENVIRONMENT:
            per_repo[repo].append(bool(episode.record.resolved))
    return {
        f"resolve_rate/{re.sub(r'[^A-Za-z0-9_.-]', '__', repo)}": sum(resolved) / len(resolved)
        for repo, resolved in sorted(per_repo.items())
    }
