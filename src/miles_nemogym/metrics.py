"""Miles rollout and eval log functions: ``nemogym/*`` and ``nemogym-eval/<set>/*`` metrics.

``--custom-rollout-log-function-path miles_nemogym.metrics.log_rollout`` and
``--custom-eval-rollout-log-function-path miles_nemogym.metrics.log_eval`` (Miles
``miles/ray/rollout/metrics.py``). Rates are over distinct episodes, quality rates over
valid ones; what each metric means and why is in docs/episode-pipeline.md.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any

from miles_nemogym.failure_kinds import metric_label
from miles_nemogym.rollout.ledger import Tally, ledger
from miles_nemogym.rollout.pass_at_k import eval_set_metrics
from miles_nemogym.rollout.roles import EVAL, TRAIN, ledger_role
from miles_nemogym.rollout.samples import episodes, flatten, record_of
from miles_nemogym.salvage import zero_loss_samples
from miles_nemogym.store.writer import seal_all

logger = logging.getLogger(__name__)

PREFIX = "nemogym/"


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


# Record fields the metrics measure: one that is unreadable is left out of its statistic
# and counted in ``corrupt_fields`` (``episode_id`` only tells episodes apart).
_MEASURED = frozenset(
    {"mask_sample", "failure_kind", "resolved", "patch_applied", "fail_to_pass", "turns", "tool_calls", "attempts"}
    | {"elapsed_s"}
)


def compute_metrics(samples: Any) -> dict[str, float]:
    """``nemogym/*`` metrics of one rollout's samples. Pure; no Miles needed."""
    flat = list(flatten(samples))
    found = episodes(flat)
    metrics: dict[str, float] = {
        "samples": float(len(flat)),
        "samples_without_record": float(sum(1 for s in flat if record_of(s) is None)),
        "episodes": float(len(found)),
    }
    if not found:
        return {PREFIX + key: value for key, value in metrics.items()}

    records = [episode.record for episode in found]
    valid = [r for r in records if not r.mask_sample]
    metrics["failure_rate"] = (len(records) - len(valid)) / len(records)
    kinds = Counter(metric_label(r.failure_kind or "unknown") for r in records if r.mask_sample)
    for kind, count in sorted(kinds.items()):
        metrics[f"failure_rate/{kind}"] = count / len(records)

    if valid:
        metrics["resolve_rate"] = sum(1 for r in valid if r.resolved) / len(valid)
        metrics["patch_applied_rate"] = sum(1 for r in valid if r.patch_applied) / len(valid)
        fractions = [r.fail_to_pass.fraction for r in valid if r.fail_to_pass is not None]
        optional = {
            "fail_to_pass_fraction_mean": _mean([f for f in fractions if f is not None]),
            "turns_mean": _mean([float(r.turns) for r in valid if r.turns is not None]),
            "tool_calls_mean": _mean([float(r.tool_calls) for r in valid if r.tool_calls is not None]),
        }
        metrics.update({key: value for key, value in optional.items() if value is not None})

    # Only episodes that were sent have a duration; a row rejected before sending has none.
    times = [r.elapsed_s for r in records if r.attempts and "elapsed_s" in r.model_fields_set]
    if times:
        metrics["episode_time_p50"] = _percentile(times, 50)
        metrics["episode_time_p95"] = _percentile(times, 95)
        metrics["episode_time_max"] = max(times)
    corrupt = sum(len(episode.unreadable & _MEASURED) for episode in found)
    if corrupt:
        metrics["corrupt_fields"] = float(corrupt)
    return {PREFIX + key: value for key, value in metrics.items()}


def ledger_metrics(tally: Tally) -> dict[str, float]:
    """``nemogym/*`` metrics of one period of the ledger. Pure."""
    metrics: dict[str, float] = {
        "episodes": float(tally.episodes),
        "episodes_cancelled": float(tally.cancelled),
        "groups_salvaged": float(tally.groups_salvaged),
        "groups_dropped": float(tally.groups_dropped),
        "outage_wait_s": round(tally.outage_wait_s, 3),
    }
    if tally.episodes:
        metrics["failure_rate"] = sum(tally.failures.values()) / tally.episodes
        for kind, count in sorted(tally.failures.items()):
            metrics[f"failure_rate/{metric_label(kind)}"] = count / tally.episodes
    return {PREFIX + key: value for key, value in metrics.items()}


def rollout_metrics(samples: Any, tally: Tally) -> dict[str, float]:
    """What ``log_rollout`` logs: sample metrics, with episode counts from the ledger. Pure."""
    metrics = compute_metrics(samples)
    metrics[PREFIX + "samples_zero_loss"] = float(zero_loss_samples(samples))
    if tally.episodes or tally.cancelled:
        # The samples' counts miss dropped groups and record-less samples: replace them.
        for key in [k for k in metrics if k.startswith(PREFIX + "failure_rate")]:
            del metrics[key]
        metrics.update(ledger_metrics(tally))
    else:
        rest = ledger_metrics(tally)
        for key in ("groups_salvaged", "groups_dropped", "outage_wait_s"):
            metrics[PREFIX + key] = rest[PREFIX + key]
    return metrics


def log_rollout(
    rollout_id: int,
    args: Any,
    samples: Any,
    rollout_extra_metrics: Any = None,
    rollout_time: float | None = None,
) -> bool:
    """Miles rollout log function: log ``nemogym/*`` metrics; returns False (Miles logs too)."""
    tally = ledger.drain()
    try:
        metrics: dict[str, Any] = dict(rollout_metrics(samples, tally))
    except Exception:  # never fail Miles' rollout logging over our metrics; the ledger's still count
        logger.exception("rollout %s: nemogym sample metrics could not be computed", rollout_id)
        metrics = dict(ledger_metrics(tally))
    _seal(TRAIN, rollout_id)
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


def _seal(role: str, rollout_id: Any) -> None:
    """File ``role``'s stored episodes under this step; the store never fails a log call."""
    try:
        seal_all(role, int(rollout_id))
    except Exception:
        logger.warning("episode store: could not file %s episodes under step %s", role, rollout_id, exc_info=True)


def eval_k(args: Any, name: str) -> int:
    """The number of samples per prompt of eval set ``name`` (its config, else the flag)."""
    for dataset in getattr(args, "eval_datasets", None) or []:
        if getattr(dataset, "name", None) == name and getattr(dataset, "n_samples_per_eval_prompt", None):
            return int(dataset.n_samples_per_eval_prompt)
    return int(getattr(args, "n_samples_per_eval_prompt", None) or 1)


def log_eval(rollout_id: int, args: Any, data: Any, extra_metrics: Any = None) -> bool:
    """Miles eval log function: log ``nemogym-eval/<set>/*`` for each eval set, file the eval
    episodes under this step in the episode store; returns False (Miles logs ``eval/*`` too)."""
    metrics: dict[str, Any] = {}
    for name, result in (data or {}).items():
        samples = result.get("samples") if isinstance(result, dict) else None
        tally = ledger.drain(ledger_role(EVAL, str(name)))
        try:
            metrics.update(eval_set_metrics(str(name), samples or [], eval_k(args, str(name)), tally))
        except Exception:  # never fail Miles' eval logging over our metrics
            logger.exception("eval %s: nemogym-eval/%s metrics could not be computed", rollout_id, name)
    _seal(EVAL, rollout_id)
    _track(args, rollout_id, metrics, "eval/step")
    return False
