"""Miles dynamic sampling filter for NeMo-Gym groups (CONTRACTS.md §3).

``--dynamic-sampling-filter-path miles_nemogym.filters.check_episode_group``

GRPO normalises each sample's reward against its prompt group. A sample whose episode
failed for infrastructure reasons scores 0.0 that says nothing about the policy, and it
would still enter the group's baseline (``remove_sample`` zeroes only the loss), so the
whole group is dropped instead. Miles takes only one filter path, so this filter also
does what Miles' ``check_no_aborted`` does (a group with an ABORTED sample is dropped),
and replaces it in the recipe.

A group is kept only when every sample carries a valid episode record. Drop reasons are
low-cardinality and become Miles metrics ``rollout/dynamic_filter/drop_<reason>``:
``group_has_aborted``, ``nemogym_<failure_kind>``, and ``nemogym_missing_record`` (the
agent function never returned for a sample, e.g. its task was cancelled).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from miles_nemogym.failure_kinds import metric_label
from miles_nemogym.samples import flatten, is_aborted, record_of


@dataclass
class FilterOutput:
    """Same shape as Miles' ``DynamicFilterOutput``, for use without Miles installed."""

    keep: bool
    reason: str | None = None


@cache
def _output_type() -> Any:
    try:
        from miles.rollout.filter_hub.base_types import DynamicFilterOutput
    except ImportError:
        return FilterOutput
    return DynamicFilterOutput


def drop_reason(samples: Any) -> str | None:
    """Why the group must be dropped, or None to keep it. Pure."""
    group = list(flatten(samples))
    if any(is_aborted(sample) for sample in group):
        return "group_has_aborted"
    for sample in group:
        record = record_of(sample)
        if record is None:
            return "nemogym_missing_record"
        if record.get("mask_sample"):
            return "nemogym_" + metric_label(str(record.get("failure_kind") or "unknown"))
    return None


def check_episode_group(args: Any, samples: Any, **kwargs: Any) -> Any:
    """Miles filter: keep the group unless an episode in it is not a valid measurement."""
    try:
        reason = drop_reason(samples)
    except Exception:  # unreadable samples are not a valid measurement; never crash the rollout
        reason = "nemogym_unreadable_record"
    return _output_type()(keep=reason is None, reason=reason)
