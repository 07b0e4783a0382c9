"""Miles agent function (``--custom-agent-function-path miles_nemogym.agent.run``; Miles agentic_tool_call.py).

    async def run(*, base_url, prompt, request_kwargs, metadata) -> {"reward", "eval_report", "nemogym"}
    async def abort(args) -> None   # Miles' over-sampling abort: stop every in-flight episode

A failed episode is recorded on the sample (``nemogym.mask_sample``), never raised; see
docs/episode-pipeline.md. Importing this module stays cheap (no torch, sglang, ray, Miles).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from miles_nemogym import failure_kinds as fk
from miles_nemogym.episode.classify import Outcome
from miles_nemogym.episode.in_flight import AWAITING_RESULT, NOT_DELIVERED, abort_all
from miles_nemogym.episode.policy_url import policy_base_url
from miles_nemogym.episode.record import REWARD_KEY, RecordRead
from miles_nemogym.episode.run import not_started, run_episode, scrubber_for
from miles_nemogym.reward import score_record
from miles_nemogym.rollout.ledger import ledger
from miles_nemogym.rollout.roles import ledger_role, role_of
from miles_nemogym.salvage import forget_held_episodes, hold_failed_episode
from miles_nemogym.settings import RewardMode, Settings, get_settings
from miles_nemogym.store.writer import entry_for, get_store, session_id

logger = logging.getLogger(__name__)

# Configuration errors repeat on every sample; each distinct message is logged once.
_logged_config_errors: set[str] = set()
_CONFIG_KINDS = frozenset({fk.INVALID_CONFIG, fk.AGENT_REQUEST_FAILED, fk.INVALID_REQUEST})


async def run(
    base_url: str,
    prompt: Any = None,
    request_kwargs: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run one NeMo-Gym episode for one Miles sample; see the module docstring."""
    return await run_with_settings(None, base_url=base_url, request_kwargs=request_kwargs, metadata=metadata)


async def run_with_settings(
    given: Settings | None,
    *,
    base_url: str,
    request_kwargs: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``run`` with settings passed by our own callers (smoke); None reads the process's once."""
    settings: Settings | None = None
    try:
        settings = get_settings() if given is None else given
        route = policy_base_url(base_url, settings.gym_url, settings.external_host)
    except Exception as error:  # a bad setting or session URL still leaves a record on the sample
        outcome = not_started(error, metadata)
    else:
        outcome = await run_episode(metadata, request_kwargs, settings, policy_base_url=route)
    _log(outcome)
    record = outcome.record
    role, eval_set = role_of(metadata)
    # The ledger sees every episode, also those whose sample Miles returns without this dict.
    ledger.record_episode(
        (record.failure_kind or fk.AGENT_RUN_ERROR) if record.mask_sample else None, ledger_role(role, eval_set)
    )
    mode = settings.reward_mode if settings is not None else RewardMode.binary
    result = outcome.to_metadata()
    result[REWARD_KEY], _ = score_record(outcome.reward, RecordRead(record), mode)
    hold_failed_episode(metadata, result)  # Miles drops this dict when no model call was made
    if settings is not None and settings.episode_dir:
        _store(settings, outcome, float(result[REWARD_KEY]), role, eval_set, base_url, metadata)
    return result


def _store(
    settings: Settings,
    outcome: Outcome,
    reward: float,
    role: str,
    eval_set: str | None,
    base_url: str,
    metadata: Mapping[str, Any] | None,
) -> None:
    """Hand the episode to the episode store; a store problem never fails the sample."""
    try:
        repo = metadata.get("repo") if isinstance(metadata, Mapping) else None
        entry = entry_for(
            record=outcome.record,
            reward=reward,
            role=role,
            eval_set=eval_set,
            session=session_id(base_url) if isinstance(base_url, str) else None,
            repo=repo if isinstance(repo, str) else None,
        )
        raw, raw_is_json = outcome.answer
        scrubber = scrubber_for(settings)
        store = get_store(str(settings.episode_dir))
        store.add(role, entry, raw, raw_is_json, scrub=None if scrubber is None else scrubber.scrub)
    except Exception:
        logger.warning("episode store: could not queue episode %s", outcome.record.episode_id, exc_info=True)


async def abort(args: Any = None) -> None:
    """Miles' over-sampling abort hook: stop every in-flight ``/run`` of this process at once;
    each stopped ``run`` returns a ``cancelled`` outcome (the server's sandbox expires by TTL)."""
    states = abort_all()
    forget_held_episodes()  # the step's groups have all been filtered
    logger.info(
        "abort: stopped %d in-flight NeMo-Gym episode(s): %d sent and awaiting their result "
        "(the server may finish them), %d not yet delivered; each is recorded as cancelled",
        sum(states.values()),
        states[AWAITING_RESULT],
        states[NOT_DELIVERED],
    )


def _log(outcome: Outcome) -> None:
    record = outcome.record
    if record.status == "ok":
        return
    kind = record.failure_kind or "?"
    if kind == fk.CANCELLED:  # abort() logs one line for all of them
        logger.debug("NeMo-Gym episode cancelled: instance=%s %s", record.instance_id, record.failure_reason)
        return
    if kind in _CONFIG_KINDS:
        message = record.failure_reason or kind
        if message in _logged_config_errors:
            return
        _logged_config_errors.add(message)
        hint = ""
        if record.http_status == 422:
            hint = " — is NEMO_GYM_URL a mini_swe_agent_2 server from nemo-gym >= 0.6?"
        logger.error("NeMo-Gym /run cannot run (%s): %s%s [logged once]", kind, message, hint)
        return
    logger.warning(
        "NeMo-Gym episode failed: instance=%s kind=%s elapsed=%.1fs attempts=%d reason=%s",
        record.instance_id,
        kind,
        record.elapsed_s,
        record.attempts,
        record.failure_reason,
    )
