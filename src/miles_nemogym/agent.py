"""Miles agent function: one NeMo-Gym ``mini_swe_agent_2`` episode per sample.

Contract (Miles ``miles/rollout/generate_hub/agentic_tool_call.py``; docs/upstream.md):

    --custom-generate-function-path miles.rollout.generate_hub.agentic_tool_call.generate
    --custom-agent-function-path    miles_nemogym.agent.run

Miles awaits ``run(base_url=..., prompt=..., request_kwargs=..., metadata=...)`` once per
sample, keyword arguments only. ``base_url`` is the sample's session on Miles' session
server (``http://<ip>:<port>/sessions/<id>``); the NeMo-Gym harness talks to the policy
only through ``<base_url>/v1``, so every model call of the episode is recorded by Miles
(token ids, logprobs, loss masks). ``prompt`` is not sent: the harness builds its own
prompt from the task instance in ``metadata``.

The returned dict is merged into every output sample's ``metadata``:

- ``reward``: the final reward, as the reward hook would score it (``NEMO_GYM_REWARD_MODE``
  applied; 0.0 for a failed episode). Under Miles' session server v2 this value becomes
  ``sample.reward`` and the reward hook is never called (Miles scores only samples whose
  reward is None), so it must already be final; the hook then agrees with it (v1);
- ``eval_report``: the server's result metadata (SWE-bench report, or its error);
- ``nemogym``: the episode record (``outcome.EpisodeRecord``): status, failure kind,
  ``mask_sample``, attempts, timings, test counts, turns.

With ``NEMO_GYM_EPISODE_DIR`` set, every episode (failed ones too) is also queued to the
episode store (``store/writer.py``) with the ``/run`` answer as received; eval episodes
are told apart by the marks Miles' eval config puts in ``metadata`` (``rollout/roles.py``).

This function never returns ``None`` and never raises for a failed episode: a failure is
recorded on the sample (``mask_sample`` true) so the reward hook, the group filter and
the rollout metrics can set it aside visibly. ``asyncio.CancelledError`` propagates.
``abort(args)`` stops every in-flight episode of the process (over-sampling abort).

Importing this module must stay cheap: no torch, sglang, ray, datasets or Miles.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from miles_nemogym import failure_kinds as fk
from miles_nemogym.episode.classify import Outcome, failure
from miles_nemogym.episode.in_flight import AWAITING_RESULT, NOT_DELIVERED, abort_all, run_episode
from miles_nemogym.episode.policy_url import PolicyUrlError, policy_base_url
from miles_nemogym.episode.request import RequestBuildError, build_run_body
from miles_nemogym.redaction import KeyScrubber, key_scrubber
from miles_nemogym.reward import score
from miles_nemogym.rollout.ledger import ledger
from miles_nemogym.rollout.roles import ledger_role, role_of
from miles_nemogym.settings import RewardMode, Settings, SettingsError, get_settings
from miles_nemogym.store.writer import entry_for, get_store, session_id

logger = logging.getLogger(__name__)

# Configuration errors repeat on every sample; each distinct message is logged once.
_logged_config_errors: set[str] = set()
_CONFIG_KINDS = frozenset({fk.INVALID_CONFIG, fk.AGENT_REQUEST_FAILED})


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
    settings: Settings | None,
    *,
    base_url: str,
    request_kwargs: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``run`` with ``settings`` given by its caller (smoke); ``None`` reads the process's (``get_settings``)."""
    raw_id = metadata.get("instance_id") if isinstance(metadata, Mapping) else None
    instance_id = None if raw_id is None else _printable(str(raw_id))
    mode = RewardMode.binary
    episode_dir: str | None = None
    scrubber: KeyScrubber | None = None
    try:
        settings = get_settings() if settings is None else settings
        mode = settings.reward_mode
        api_key = settings.policy_api_key.get_secret_value() if settings.policy_api_key else None
        episode_dir = settings.episode_dir
        scrubber = key_scrubber(api_key)
        body = build_run_body(
            metadata,
            request_kwargs,
            policy_base_url=policy_base_url(base_url, settings.gym_url, settings.external_host),
            policy_api_key=api_key,
        )
    except SettingsError as error:
        outcome = failure(fk.INVALID_CONFIG, str(error), instance_id=instance_id)
    except (RequestBuildError, PolicyUrlError) as error:
        outcome = failure(fk.INVALID_REQUEST, str(error), instance_id=instance_id)
    except Exception as error:  # a defect here must still leave a record on the sample
        logger.exception("miles-nemogym could not build the /run request for %s", instance_id)
        outcome = failure(fk.CLIENT_ERROR, f"{type(error).__name__}: {error}", instance_id=instance_id)
    else:
        outcome = await run_episode(body, settings)
    outcome.record.episode_id = uuid.uuid4().hex
    # The API key was scrubbed from the server's answer as it arrived (client.scrub); our
    # own fields never hold it. The raw answer kept for the store is scrubbed by the store.
    _log(outcome)
    record = outcome.record
    role, eval_set = role_of(metadata)
    # The ledger sees every episode, also those whose sample Miles returns without this dict.
    ledger.record_episode(
        (record.failure_kind or fk.AGENT_RUN_ERROR) if record.mask_sample else None, ledger_role(role, eval_set)
    )
    result = outcome.to_metadata()
    result["reward"], _ = score(result, mode)
    if episode_dir:
        _store(episode_dir, outcome, result, role, eval_set, base_url, metadata, scrubber)
    return result


def _store(
    directory: str,
    outcome: Outcome,
    result: dict[str, Any],
    role: str,
    eval_set: str | None,
    base_url: str,
    metadata: Mapping[str, Any] | None,
    scrubber: KeyScrubber | None,
) -> None:
    """Hand the episode to the episode store; a store problem never fails the sample."""
    try:
        repo = metadata.get("repo") if isinstance(metadata, Mapping) else None
        entry = entry_for(
            record=result["nemogym"],
            reward=float(result["reward"]),
            role=role,
            eval_set=eval_set,
            session=session_id(base_url) if isinstance(base_url, str) else None,
            repo=repo if isinstance(repo, str) else None,
        )
        raw, raw_is_json = outcome.answer
        get_store(directory).add(role, entry, raw, raw_is_json, scrub=None if scrubber is None else scrubber.scrub)
    except Exception:
        logger.warning("episode store: could not queue episode %s", outcome.record.episode_id, exc_info=True)


async def abort(args: Any = None) -> None:
    """Miles' over-sampling abort hook: stop every in-flight ``/run`` of this process.

    Returns at once; each stopped ``run`` returns a ``cancelled`` outcome. The server-side
    episodes cannot be cancelled over the API (NeMo-Gym has no cancel endpoint); closing
    their connections is all a client can do, and their sandboxes expire by TTL. One log
    line per abort, however many episodes it stops.
    """
    states = abort_all()
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
    if kind in _CONFIG_KINDS or kind == fk.INVALID_REQUEST:
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


def _printable(text: str) -> str:
    """``text`` safe to log and serialize: a lone surrogate is shown escaped."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
