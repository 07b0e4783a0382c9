"""Train a prompt group over its valid episodes when some of its episodes failed.

``--custom-reward-post-process-path miles_nemogym.salvage.reward_post_process``: Miles'
own normalisation over each group's valid samples; failed episodes get zero loss and a
normalised reward of 0 (docs/episode-pipeline.md).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from miles_nemogym.episode.record import flatten, is_aborted, record_of
from miles_nemogym.failure_kinds import metric_label

HOOK_PATH = "miles_nemogym.salvage.reward_post_process"
"""What ``--custom-reward-post-process-path`` must name for a partly failed group to be kept."""


def is_masked(sample: Any) -> bool:
    """Whether the sample's episode is not a valid measurement (our record says so)."""
    record = record_of(sample)
    return record is not None and record.mask_sample


def effective_min_valid(min_valid: int, group_size: int) -> int:
    """``NEMO_GYM_MIN_VALID_PER_GROUP`` clamped to the group's size (0 stays 0)."""
    return min(min_valid, group_size)


def group_verdict(samples: Any, min_valid: int, group_size: int | None = None) -> tuple[str | None, bool]:
    """(drop reason or None to keep, whether a kept group holds failed episodes). Pure.
    ``group_size``: the episodes the group was meant to have (default: those seen)."""
    group = list(flatten(samples))
    # An ABORTED sample carries no reward or logprobs next to the others: Miles could not
    # assemble it, so the group cannot be trained as it is.
    if any(is_aborted(sample) for sample in group):
        return "group_has_aborted", False
    valid: set[object] = set()
    failed: dict[object, str] = {}
    for position, sample in enumerate(group):
        record = record_of(sample)
        if record is None:
            return "nemogym_missing_record", False
        key = record.episode_id if record.episode_id is not None else ("sample", position)
        if record.mask_sample:
            failed.setdefault(key, metric_label(record.failure_kind or "unknown"))
        else:
            valid.add(key)
    if not failed:
        return None, False
    first_kind = next(iter(failed.values()))
    needed = effective_min_valid(min_valid, group_size if group_size is not None else len(valid) + len(failed))
    if needed == 0 or len(valid) < needed:
        return "nemogym_" + first_kind, False
    return None, True


@cache
def _miles_post_process() -> Callable[..., tuple[list[float], list[float]]]:
    try:
        from miles.ray.rollout.train_data_conversion import _post_process_rewards
    except ImportError as error:
        raise RuntimeError(
            "miles_nemogym.salvage.reward_post_process needs Miles' "
            "miles.ray.rollout.train_data_conversion._post_process_rewards (radixark/miles 31f1ca9); "
            f"this Miles does not provide it ({error}). Remove --custom-reward-post-process-path and set "
            "NEMO_GYM_MIN_VALID_PER_GROUP=0 to drop partly failed groups instead"
        ) from error
    return _post_process_rewards  # type: ignore[no-any-return]


def reward_post_process(args: Any, samples: Any) -> tuple[list[float], list[float]]:
    """Miles reward post-process hook: (raw rewards, normalised rewards), one per sample.
    Failed episodes: ``remove_sample``, 0.0 and 0.0; each group's valid samples normalised
    by Miles over themselves alone. Without failed samples: exactly Miles' default."""
    flat = list(flatten(samples))
    miles_post_process = _miles_post_process()
    masked = [is_masked(sample) for sample in flat]
    if not any(masked):
        return miles_post_process(args, flat, None)

    raw_rewards = [0.0] * len(flat)
    normalized = [0.0] * len(flat)
    groups: dict[object, list[int]] = {}
    for position, sample in enumerate(flat):
        if masked[position]:
            sample.remove_sample = True
            continue
        group_index = getattr(sample, "group_index", None)
        if group_index is None:
            raise ValueError(
                "miles_nemogym.salvage.reward_post_process: a sample has no group_index, so its prompt "
                "group cannot be told apart; set NEMO_GYM_MIN_VALID_PER_GROUP=0 (drop partly failed groups) "
                "and remove --custom-reward-post-process-path"
            )
        groups.setdefault(group_index, []).append(position)
    for positions in groups.values():
        # One call per group: Miles sees a batch made of this group's valid samples only.
        raw, norm = miles_post_process(args, [flat[i] for i in positions], None)
        for position, raw_value, norm_value in zip(positions, raw, norm, strict=True):
            raw_rewards[position] = float(raw_value)
            normalized[position] = float(norm_value)
    return raw_rewards, normalized


def zero_loss_samples(samples: Any) -> int:
    """How many of ``samples`` the post-process hook will train with zero loss."""
    return sum(1 for sample in flatten(samples) if is_masked(sample))
