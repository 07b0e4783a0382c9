"""Miles dynamic sampling filter: ``--dynamic-sampling-filter-path miles_nemogym.filters.check_episode_group``.

``check_episode_group(args, group)`` is called once per finished prompt group (Miles
``inference_rollout_train.py``): it keeps a group that can be trained, drops the rest with a
reason, and raises ``RunStopped`` when the run must stop (``check_run``: an outage past
``NEMO_GYM_OUTAGE_TIMEOUT``, a failure streak). Why: docs/episode-pipeline.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache
from typing import Any

from miles_nemogym.errors import RunStopped, counted
from miles_nemogym.runtime import current, streak_stop
from miles_nemogym.salvage import HOOK_PATH, group_verdict, recover_failed_episodes
from miles_nemogym.settings import Settings

__all__ = ["check_episode_group"]

logger = logging.getLogger(__name__)

REWARD_POST_PROCESS = HOOK_PATH


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
    if not wired:
        current().logged.log(
            logger,
            logging.WARNING,
            "salvage not wired",
            "partly failed groups are dropped: --custom-reward-post-process-path is not %s, which trains "
            "them over their valid episodes (NEMO_GYM_MIN_VALID_PER_GROUP needs it)",
            REWARD_POST_PROCESS,
        )
    return wired


def stop_reason(settings: Settings) -> str | None:
    """Why the run must stop now (an outage past ``NEMO_GYM_OUTAGE_TIMEOUT``, a failure streak), or
    None. Reads the process's state; changes nothing."""
    return current().circuits.stop_error() or streak_stop(settings, current().ledger)


def check_run(settings: Settings) -> None:
    """Raise ``RunStopped`` if the run must stop, after stopping this process's in-flight episodes
    (Miles' end-of-step abort does not run on that path). Miles swallows the agent function's
    exceptions, but one from the group filter ends the rollout (``inference_rollout_train.py``)."""
    reason = stop_reason(settings)
    if reason is None:
        return
    stopped = sum(current().in_flight.abort_all().values())
    logger.error("%s (stopped %s)", reason, counted(stopped, "in-flight episode"))
    raise RunStopped(reason)


def judge_group(args: Any, samples: Any) -> tuple[str | None, bool]:
    """(drop reason or None to keep, whether kept with failed episodes) for a finished group,
    after giving back the failed episodes salvage held for its ABORTED samples; records
    nothing. Raises ``RunStopped`` when the run must stop (``check_run``)."""
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
    """Miles filter: keep the group when it can be trained; raise ``RunStopped`` when the
    run must stop (see the module docstring)."""
    reason, salvaged = judge_group(args, samples)
    current().ledger.record_group(kept=reason is None, salvaged=salvaged)
    return _output_type()(keep=reason is None, reason=reason)
