"""Miles reward hook: ``--custom-rm-path miles_nemogym.reward.reward_func`` (CONTRACTS.md §2).

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
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any

from miles_nemogym.samples import metadata_of
from miles_nemogym.settings import RewardMode, get_settings

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
        return _partial_credit(record, float(reward)), None
    return float(reward), None


def _partial_credit(record: dict[str, Any], reward: float) -> float:
    f2p, p2p = record.get("fail_to_pass"), record.get("pass_to_pass")
    if not isinstance(f2p, dict) or not isinstance(p2p, dict):
        return reward
    if p2p.get("failed", 0):
        return 0.0
    total = f2p.get("passed", 0) + f2p.get("failed", 0)
    return f2p.get("passed", 0) / total if total else reward


def _score_sample(sample: Any, mode: RewardMode) -> float:
    value, problem = score(metadata_of(sample), mode)
    if problem is not None:
        problems[problem] += 1
        count = problems[problem]
        # The first few, then every 100th: enough to notice, never a flood.
        if count <= 3 or count % 100 == 0:
            instance = metadata_of(sample).get("instance_id")
            logger.warning("reward 0.0 for %s: %s (%d so far)", instance, problem, count)
    return value


async def reward_func(args: Any, samples: Any, **kwargs: Any) -> float | list[float]:
    """Miles reward hook; see the module docstring."""
    mode = get_settings().reward_mode
    if isinstance(samples, list):
        return [_score_sample(sample, mode) for sample in samples]
    return _score_sample(samples, mode)
