"""Miles' per-group hooks: which episodes of a finished prompt group are trained.

    --dynamic-sampling-filter-path miles_nemogym.groups.check_episode_group  (Miles inference_rollout_train.py)
    def check_episode_group(args, samples) -> DynamicFilterOutput(keep, reason)  # RunStopped ends the rollout
    --custom-reward-post-process-path miles_nemogym.groups.reward_post_process  (Miles train_data_conversion.py)
    def reward_post_process(args, samples) -> (raw rewards, normalised rewards), one per sample

One rule, ``group_verdict``, decides for both: a group with failed episodes is kept when at least
``NEMO_GYM_MIN_VALID_PER_GROUP`` are valid and the post-process hook is wired (failed episodes get zero
loss). The filter also stops the run (``check_run``) and gives ABORTED samples their held failed
episodes (``recover_failed_episodes``). Why: docs/episode-pipeline.md ("Reward, filter, salvage, metrics").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from miles_nemogym.episode.record import (
    RECORD_KEY,
    REWARD_KEY,
    TRAIN,
    Task,
    flatten,
    is_aborted,
    metadata_of,
    read_record,
    record_of,
)
from miles_nemogym.errors import POLICY_TIMEOUT, RunStopped, counted, metric_label
from miles_nemogym.runtime import HeldEpisodes, current, streak_stop
from miles_nemogym.settings import Settings

__all__ = ["check_episode_group", "reward_post_process"]

logger = logging.getLogger(__name__)

FILTER_PATH = "miles_nemogym.groups.check_episode_group"  # --dynamic-sampling-filter-path
POST_PROCESS_PATH = "miles_nemogym.groups.reward_post_process"  # --custom-reward-post-process-path
GROUP_HAS_ABORTED = "group_has_aborted"  # the reason for a group still holding an ABORTED sample


def _is_masked(sample: Any) -> bool:
    record = record_of(sample)
    return record is not None and record.mask_sample


def group_verdict(samples: Any, min_valid: int, group_size: int | None = None) -> tuple[str | None, bool]:
    """(drop reason or None to keep, kept with failed episodes). Pure; ``group_size``: default those seen."""
    group = list(flatten(samples))
    # An ABORTED sample carries no reward or logprobs next to the others: Miles could not
    # assemble it, so the group cannot be trained as it is.
    if any(is_aborted(sample) for sample in group):
        return GROUP_HAS_ABORTED, False
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
    # NEMO_GYM_MIN_VALID_PER_GROUP clamped to the group's size (0 stays 0)
    needed = min(min_valid, group_size if group_size is not None else len(valid) + len(failed))
    if needed == 0 or len(valid) < needed:
        return "nemogym_" + first_kind, False
    return None, True


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


def _salvage_wired(args: Any) -> bool:
    """Whether Miles trains a partly failed group over its valid episodes (our post-process hook is wired)."""
    wired = getattr(args, "custom_reward_post_process_path", None) == POST_PROCESS_PATH
    if not wired:
        current().logged.log(
            logger,
            logging.WARNING,
            "salvage not wired",
            "partly failed groups are dropped: --custom-reward-post-process-path is not %s, which trains "
            "them over their valid episodes (NEMO_GYM_MIN_VALID_PER_GROUP needs it)",
            POST_PROCESS_PATH,
        )
    return wired


def stop_reason(settings: Settings) -> str | None:
    """Why the run must stop now (an outage past its timeout, a failure streak), or None; changes nothing."""
    return current().circuits.stop_error() or streak_stop(settings, current().ledger)


def check_run(settings: Settings) -> None:
    """Raise ``RunStopped`` if the run must stop, after stopping this process's in-flight episodes."""
    reason = stop_reason(settings)
    if reason is None:
        return
    stopped = sum(current().in_flight.abort_all().values())
    logger.error("%s (stopped %s)", reason, counted(stopped, "in-flight episode"))
    raise RunStopped(reason)


def judge_group(args: Any, samples: Any) -> tuple[str | None, bool]:
    """``group_verdict`` of a finished group, held episodes given back; records nothing (``check_run`` may raise)."""
    settings = current().settings
    check_run(settings)  # the one exception meant to leave this hook
    group_size = getattr(args, "n_samples_per_prompt", None)
    min_valid = settings.min_valid_per_group if _salvage_wired(args) else 0
    try:
        recover_failed_episodes(current().held, samples)  # episodes that failed before their first policy call
        return group_verdict(samples, min_valid, group_size)
    except Exception:  # unreadable samples are not a valid measurement; never crash the rollout
        return "nemogym_unreadable_record", False


def check_episode_group(args: Any, samples: Any, **kwargs: Any) -> Any:
    """Miles filter: keep the group when it can be trained; raise ``RunStopped`` when the run must stop."""
    reason, salvaged = judge_group(args, samples)
    current().ledger.record_group(kept=reason is None, salvaged=salvaged)
    return _output_type()(keep=reason is None, reason=reason)


@cache
def _miles_post_process() -> Callable[..., tuple[list[float], list[float]]]:
    try:
        from miles.ray.rollout.train_data_conversion import _post_process_rewards
    except ImportError as error:
        raise RuntimeError(
            "miles_nemogym.groups.reward_post_process needs Miles' "
            "miles.ray.rollout.train_data_conversion._post_process_rewards (radixark/miles 31f1ca9); "
            f"this Miles does not provide it ({error}). Remove --custom-reward-post-process-path and set "
            "NEMO_GYM_MIN_VALID_PER_GROUP=0 to drop partly failed groups instead"
        ) from error
    return _post_process_rewards  # type: ignore[no-any-return]


def reward_post_process(args: Any, samples: Any) -> tuple[list[float], list[float]]:
    """Miles' hook: failed episodes ``remove_sample``, 0.0 and 0.0; each group's valid ones normalised by Miles."""
    flat = list(flatten(samples))
    miles_post_process = _miles_post_process()
    masked = [_is_masked(sample) for sample in flat]
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
                "miles_nemogym.groups.reward_post_process: a sample has no group_index, so its prompt "
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
    """Samples that train with zero loss: failed episodes and recovered ones (``remove_sample`` set)."""
    return sum(1 for sample in flatten(samples) if _is_masked(sample) or getattr(sample, "remove_sample", False))


# ----------------------------------------------------------------------------- failed before the policy


def hold_failed_episode(held: HeldEpisodes, task: Task, result: Mapping[str, Any], *, aborted: bool) -> None:
    """Keep the agent function's dict of a failed or timed-out train episode until the filter sees its
    sample, which Miles may return ABORTED without it; not one our abort stopped (never filtered)."""
    record = read_record(result).record
    if (
        aborted
        or record is None
        or not (record.mask_sample or record.failure_kind == POLICY_TIMEOUT)  # a /run may time out before a turn
        or record.episode_id is None
        or task.task_id is None
        or task.role != TRAIN
    ):
        return
    held.hold(task.task_id, record.episode_id, dict(result))


def recover_failed_episodes(held: HeldEpisodes, samples: Any) -> int:
    """Give each ABORTED, record-less sample its task's held episode, as a zero-loss sample; returns how many.
    Samples with their record release theirs; one no valid sibling can mend gets the dict and stays ABORTED."""
    group = list(flatten(samples))
    for sample in group:
        record = record_of(sample)
        task = Task.of(metadata_of(sample)).task_id
        if record is not None and record.episode_id is not None and task is not None:
            held.release(task, record.episode_id)
    template = next((sample for sample in group if _can_template(sample)), None)
    recovered = 0
    for sample in group:
        if not is_aborted(sample) or RECORD_KEY in metadata_of(sample):
            continue
        task = Task.of(metadata_of(sample)).task_id
        result = None if task is None else held.claim(task)
        if result is None:
            continue
        # The agent's dict merged into the sample's metadata, as Miles merges it, and its reward.
        metadata = getattr(sample, "metadata", None)
        if not isinstance(metadata, dict):
            metadata = sample.metadata = {}
        metadata.update(result)
        reward = result.get(REWARD_KEY)
        sample.reward = float(reward) if isinstance(reward, (int, float)) else 0.0
        if template is not None:
            _as_zero_loss_sample(sample, template)
            recovered += 1
    return recovered


def _can_template(sample: Any) -> bool:
    record = record_of(sample)
    tokens = getattr(sample, "tokens", None)
    return (
        record is not None
        and not record.mask_sample
        and not is_aborted(sample)
        and isinstance(tokens, list)
        and len(tokens) >= 2
        and getattr(sample, "response_length", 0) >= 1
    )


def _as_zero_loss_sample(sample: Any, template: Any) -> None:
    """What Miles returns for an episode with one model call, with zero loss: a valid sibling's first two tokens."""
    sample.tokens = list(template.tokens[:2])
    sample.response = ""
    sample.response_length = 1
    sample.loss_mask = [0]
    sample.remove_sample = True
    for name in ("rollout_log_probs", "teacher_log_probs", "opd_reverse_kl"):
        setattr(sample, name, None if getattr(template, name, None) is None else [0.0])
    for name in ("rollout_routed_experts", "rollout_indexer_topk"):  # (tokens - 1, ...) arrays
        value = getattr(template, name, None)
        setattr(sample, name, None if value is None else value[:1])
    sample.weight_versions = list(getattr(template, "weight_versions", None) or [])
    sample.status = getattr(type(template.status), "FAILED", "failed")  # Miles' Sample.Status.FAILED
