"""Miles reward hook: ``--custom-rm-path miles_nemogym.reward.reward_func``.

``await reward_func(args, sample) -> float`` or ``(args, [samples]) -> [float]`` (Miles
``miles/rollout/rm_hub/__init__.py``). It scores the reward the agent function stored,
under ``NEMO_GYM_REWARD_MODE``, and never raises; the rules are in docs/episode-pipeline.md.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from miles_nemogym.episode.record import (
    REWARD_KEY,
    SWE_ENVIRONMENT,
    EpisodeRecord,
    RecordRead,
    metadata_of,
    read_record,
)
from miles_nemogym.errors import SettingsError
from miles_nemogym.runtime import current
from miles_nemogym.settings import RewardMode

__all__ = ["reward_func"]

logger = logging.getLogger(__name__)

_TEST_COUNTS = frozenset({"fail_to_pass", "pass_to_pass"})


def score(metadata: dict[str, Any], mode: RewardMode = RewardMode.binary) -> tuple[float, str | None]:
    """(reward, problem) for one sample's metadata; ``problem`` is None when the reward is sound."""
    return score_record(metadata.get(REWARD_KEY), read_record(metadata), mode)


def score_record(reward: Any, read: RecordRead, mode: RewardMode) -> tuple[float, str | None]:
    """(reward, problem) for a stored reward and the episode's record, by the rules in
    docs/episode-pipeline.md ("Reward"); ``problem`` is None when the reward is sound."""
    record = read.record
    if record is not None and record.mask_sample:
        return 0.0, None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return 0.0, "missing_reward" if reward is None else "non_numeric_reward"
    if not math.isfinite(reward):
        return 0.0, "non_finite_reward"
    # Partial credit reads SWE-bench test counts: an environment's reward is its verifier's.
    if mode is RewardMode.partial and record is not None and record.env == SWE_ENVIRONMENT and not record.resolved:
        if read.unreadable & _TEST_COUNTS:
            return float(reward), "invalid_test_counts"
        return partial_credit(record, float(reward)), None
    return float(reward), None


def partial_credit(record: EpisodeRecord, reward: float) -> float:
    """The partial-credit reward of an unresolved episode (``reward`` without test counts)."""
    if record.fail_to_pass is None or record.pass_to_pass is None:
        return reward
    if record.pass_to_pass.failed:
        return 0.0
    fraction = record.fail_to_pass.fraction
    return reward if fraction is None else fraction


def _score_sample(sample: Any, mode: RewardMode) -> float:
    try:
        value, problem = score(metadata_of(sample), mode)
    except Exception:  # a record no rule above foresaw: set aside, never crash the rollout
        value, problem = 0.0, "unreadable_record"
    if problem is not None:
        current().reward_problems[problem] += 1
        count = current().reward_problems[problem]
        # The first few, then every 100th: enough to notice, never a flood.
        if count <= 3 or count % 100 == 0:
            instance = str(metadata_of(sample).get("instance_id"))[:200]
            logger.warning("reward %s for %s: %s (%d so far)", value, instance, problem, count)
    return value


def _mode() -> RewardMode:
    try:
        return current().settings.reward_mode
    except SettingsError as error:
        current().logged.log(logger, logging.ERROR, f"reward {error}", "reward hook: %s; scoring in binary mode", error)
        return RewardMode.binary


async def reward_func(args: Any, samples: Any, **kwargs: Any) -> float | list[float]:
    """Miles reward hook; see the module docstring."""
    mode = _mode()
    if isinstance(samples, list):
        return [_score_sample(sample, mode) for sample in samples]
    return _score_sample(samples, mode)
