"""Per-rollout ``nemogym/*`` metrics (Miles ``miles/ray/rollout/metrics.py``; docs/upstream.md).

``--custom-rollout-log-function-path miles_nemogym.metrics.log_rollout``
``--custom-eval-rollout-log-function-path miles_nemogym.metrics.log_eval``

Miles calls ``log_rollout(rollout_id, args, samples, rollout_extra_metrics, rollout_time)``
synchronously with the rollout's flat sample list. We compute what a SWE-bench RL run
needs to be watched by (resolve rate, infrastructure failure rate per kind, patch-applied
rate, FAIL_TO_PASS progress, episode time and turns), log it through Miles' tracking
(wandb / tensorboard / ... as configured) and return False so Miles' own rollout logging
still runs.

Rates are over distinct episodes (``episode_id``), quality rates over valid episodes
only: a resolve rate diluted by crashed containers would read as a policy regression.

``episodes``, ``failure_rate`` and ``failure_rate/<kind>`` come from the process's
ledger (``rollout/ledger.py``) when it saw episodes: it counts every train episode the agent
function finished since the last log, also those in dropped groups and those whose sample
Miles returned without our record (a failure before the first policy call). Episodes
stopped by ``abort()`` (Miles' end-of-step abort of over-sampled episodes) are
``episodes_cancelled``, neither episodes nor failures.

A field of the wrong type in a record (a corrupted or hand-edited sample) is left out of
the statistic it feeds and counted in ``nemogym/corrupt_fields``; this hook never raises.
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


class _Reader:
    """Reads numeric record fields, counting the ones of the wrong type."""

    def __init__(self) -> None:
        self.corrupt = 0

    def number(self, record: dict[str, Any], key: str) -> float | None:
        value = record.get(key)
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            return float(value)
        self.corrupt += 1
        return None

    def fraction(self, counts: Any) -> float | None:
        if not isinstance(counts, dict):
            return None
        passed, failed = self.number(counts, "passed") or 0.0, self.number(counts, "failed") or 0.0
        return passed / (passed + failed) if passed + failed else None


def compute_metrics(samples: Any) -> dict[str, float]:
    """``nemogym/*`` metrics of one rollout's samples. Pure; no Miles needed."""
    flat = list(flatten(samples))
    records = episodes(flat)
    metrics: dict[str, float] = {
        "samples": float(len(flat)),
        "samples_without_record": float(sum(1 for s in flat if record_of(s) is None)),
        "episodes": float(len(records)),
    }
    if not records:
        return {PREFIX + key: value for key, value in metrics.items()}

    read = _Reader()
    valid = [r for r in records if not r.get("mask_sample")]
    failed = len(records) - len(valid)
    metrics["failure_rate"] = failed / len(records)
    kinds = Counter(metric_label(str(r.get("failure_kind") or "unknown")) for r in records if r.get("mask_sample"))
    for kind, count in sorted(kinds.items()):
        metrics[f"failure_rate/{kind}"] = count / len(records)

    if valid:
        metrics["resolve_rate"] = sum(1 for r in valid if r.get("resolved")) / len(valid)
        metrics["patch_applied_rate"] = sum(1 for r in valid if r.get("patch_applied")) / len(valid)
        fractions = [f for f in (read.fraction(r.get("fail_to_pass")) for r in valid) if f is not None]
        optional = {
            "fail_to_pass_fraction_mean": _mean(fractions),
            "turns_mean": _mean([n for n in (read.number(r, "turns") for r in valid) if n is not None]),
            "tool_calls_mean": _mean([n for n in (read.number(r, "tool_calls") for r in valid) if n is not None]),
        }
        metrics.update({key: value for key, value in optional.items() if value is not None})

    # Only episodes that were sent have a duration; a row rejected before sending has none.
    times = [t for t in (read.number(r, "elapsed_s") for r in records if read.number(r, "attempts")) if t is not None]
    if times:
        metrics["episode_time_p50"] = _percentile(times, 50)
        metrics["episode_time_p95"] = _percentile(times, 95)
        metrics["episode_time_max"] = max(times)
    if read.corrupt:
        metrics["corrupt_fields"] = float(read.corrupt)
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
    """Miles eval log function (``--custom-eval-rollout-log-function-path``): log
    ``nemogym-eval/<set>/*`` (``rollout/pass_at_k.py``) for each eval set, file the eval
    episodes under this step in the episode store, and return False so Miles' own
    ``eval/*`` logging still runs."""
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
