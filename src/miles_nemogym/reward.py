"""Miles reward hook: ``--custom-rm-path miles_nemogym.reward.reward_func``.

Called by Miles ``miles/rollout/rm_hub/__init__.py`` (docs/upstream.md).

Miles calls ``await reward_func(args, sample)`` for one sample (returns a float) or
``await reward_func(args, [samples])`` for a batch (returns floats in the same order;
with session server v2 the batch may be empty). The reward was measured by NeMo-Gym and
stored by the agent function in ``sample.metadata["reward"]``; this hook only reads it.

Rules, in order:
1. ``metadata["nemogym"]["mask_sample"]`` true -> 0.0. The episode failed for reasons
   outside the policy; the group filter drops its group, so this 0.0 never trains.
2. A missing or non-finite reward -> 0.0, counted and logged: it means the agent
   function did not run to completion for this sample.
3. ``NEMO_GYM_REWARD_MODE=binary`` (default): the server's reward (1.0 = resolved).
   ``partial``: 1.0 when resolved; else the fraction of FAIL_TO_PASS tests that pass,
   provided every PASS_TO_PASS test passes (a patch that breaks passing tests earns 0).

Miles calls this hook for every sample, so it never raises: a corrupted record scores
0.0 (or its server reward, when only its test counts are unreadable), counted in
``problems`` and logged; invalid ``NEMO_GYM_*`` settings are logged once and binary mode
is used (the agent function has already masked every sample under that configuration).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any

from miles_nemogym.rollout.samples import metadata_of
from miles_nemogym.settings import RewardMode, SettingsError, get_settings

logger = logging.getLogger(__name__)

problems: Counter[str] = Counter()
"""How many samples scored 0.0 because their reward was missing or invalid, by reason."""


def score(metadata: dict[str, Any], mode: RewardMode = RewardMode.binary) -> tuple[float, str | None]:
    """(reward, problem) for one sample's metadata; ``problem`` is None when the reward is sound."""
    record = metadata.get("nemogym")
    record = record if isinstance(record, dict) else {}
    if record.get("mask_sample"):
        return 0.0, None
    reward = metadata.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return 0.0, "missing_reward" if reward is None else "non_numeric_reward"
    if not math.isfinite(reward):
        return 0.0, "non_finite_reward"
    if mode is RewardMode.partial and not record.get("resolved"):
        credit = _partial_credit(record, float(reward))
        return (float(reward), "invalid_test_counts") if credit is None else (credit, None)
    return float(reward), None


def _count(counts: dict[str, Any], key: str) -> int | None:
    value = counts.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _partial_credit(record: dict[str, Any], reward: float) -> float | None:
    """The partial-credit reward, or None when the record's test counts are unreadable."""
    f2p, p2p = record.get("fail_to_pass"), record.get("pass_to_pass")
    if not isinstance(f2p, dict) or not isinstance(p2p, dict):
        return reward
    passed, failed, p2p_failed = _count(f2p, "passed"), _count(f2p, "failed"), _count(p2p, "failed")
    if passed is None or failed is None or p2p_failed is None:
        return None
    if p2p_failed:
        return 0.0
    total = passed + failed
    return passed / total if total else reward


def _score_sample(sample: Any, mode: RewardMode) -> float:
    try:
        value, problem = score(metadata_of(sample), mode)
    except Exception:  # a record no rule above foresaw: set aside, never crash the rollout
        value, problem = 0.0, "unreadable_record"
    if problem is not None:
        problems[problem] += 1
        count = problems[problem]
        # The first few, then every 100th: enough to notice, never a flood.
        if count <= 3 or count % 100 == 0:
            instance = str(metadata_of(sample).get("instance_id"))[:200]
            logger.warning("reward %s for %s: %s (%d so far)", value, instance, problem, count)
    return value


_config_errors_logged: set[str] = set()


def _mode() -> RewardMode:
    try:
        return get_settings().reward_mode
    except SettingsError as error:
        if str(error) not in _config_errors_logged:
            _config_errors_logged.add(str(error))
            logger.error("reward hook: %s; scoring in binary mode [logged once]", error)
        return RewardMode.binary


async def reward_func(args: Any, samples: Any, **kwargs: Any) -> float | list[float]:
    """Miles reward hook; see the module docstring."""
    mode = _mode()
    if isinstance(samples, list):
        return [_score_sample(sample, mode) for sample in samples]
    return _score_sample(samples, mode)
