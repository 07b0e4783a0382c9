"""Miles dynamic sampling filter: ``--dynamic-sampling-filter-path miles_nemogym.filters.check_episode_group``.

``check_episode_group(args, group)`` is called once per finished prompt group (Miles
``inference_rollout_train.py``): it keeps a group that can be trained, drops the rest with a
reason, and raises ``RunStopped`` when the server cannot produce episodes. Why: docs/episode-pipeline.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache
from typing import Any

from miles_nemogym.rollout.ledger import check_run, ledger
from miles_nemogym.salvage import HOOK_PATH, group_verdict, recover_failed_episodes
from miles_nemogym.settings import get_settings

logger = logging.getLogger(__name__)

REWARD_POST_PROCESS = HOOK_PATH
_warned: list[bool] = []


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
    """Whether Miles will train a kept, partly failed group over its valid episodes; without
    our post-process hook the failed episodes' 0.0 would train, so such groups are dropped."""
    wired = getattr(args, "custom_reward_post_process_path", None) == REWARD_POST_PROCESS
    if not wired and not _warned:
        _warned.append(True)
        logger.warning(
            "partly failed groups are dropped: --custom-reward-post-process-path is not %s, which trains "
            "them over their valid episodes (NEMO_GYM_MIN_VALID_PER_GROUP needs it)",
            REWARD_POST_PROCESS,
        )
    return wired


def check_episode_group(args: Any, samples: Any, **kwargs: Any) -> Any:
    """Miles filter: keep the group when it can be trained; raise ``RunStopped`` when the
    run must stop (see the module docstring)."""
    settings = get_settings()
    check_run(settings)  # the one exception meant to leave this hook
    group_size = getattr(args, "n_samples_per_prompt", None)
    min_valid = settings.min_valid_per_group if _salvage_wired(args) else 0
    try:
        recover_failed_episodes(samples)  # episodes that failed before their first policy call
        reason, salvaged = group_verdict(samples, min_valid, group_size)
    except Exception:  # unreadable samples are not a valid measurement; never crash the rollout
        reason, salvaged = "nemogym_unreadable_record", False
    ledger.record_group(kept=reason is None, salvaged=salvaged)
    return _output_type()(keep=reason is None, reason=reason)
