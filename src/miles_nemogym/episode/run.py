"""One episode from start to finish: build the ``/run`` body, send it, classify, finish the record.

``agent.run`` and the scan both call ``run_episode``, so a scan that passes vouches for
training; the steps and their reasons are in docs/episode-pipeline.md.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from miles_nemogym import failure_kinds as fk
from miles_nemogym.episode.classify import Outcome, failure
from miles_nemogym.episode.in_flight import send
from miles_nemogym.episode.policy_url import PolicyUrlError
from miles_nemogym.episode.request import RequestBuildError, build_run_body
from miles_nemogym.redaction import KeyScrubber, key_scrubber
from miles_nemogym.settings import Settings, SettingsError

logger = logging.getLogger(__name__)


def api_key_of(settings: Settings) -> str | None:
    """The policy API key sent with episodes (``NEMO_GYM_POLICY_API_KEY``), if any."""
    return settings.policy_api_key.get_secret_value() if settings.policy_api_key else None


def scrubber_for(settings: Settings) -> KeyScrubber | None:
    """What removes the policy API key from outside text; None when there is nothing to hide."""
    return key_scrubber(api_key_of(settings))


def instance_id_of(metadata: Any) -> str | None:
    """The task's ``instance_id`` as the record keeps it: text, a lone surrogate escaped."""
    raw = metadata.get("instance_id") if isinstance(metadata, Mapping) else None
    if raw is None:
        return None
    text = str(raw)
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def build_body(
    metadata: Mapping[str, Any] | None,
    request_kwargs: Mapping[str, Any] | None,
    settings: Settings,
    *,
    policy_base_url: str | None,
    send_api_key: bool = True,
) -> dict[str, Any]:
    """The ``/run`` body for one task row; raises ``RequestBuildError`` naming the bad field.
    ``policy_base_url`` None lets the server use its own model; ``send_api_key`` False keeps
    the key from going with the request."""
    return build_run_body(
        metadata,
        request_kwargs,
        policy_base_url=policy_base_url,
        policy_api_key=api_key_of(settings) if send_api_key else None,
    )


async def run_episode(
    metadata: Mapping[str, Any] | None,
    request_kwargs: Mapping[str, Any] | None,
    settings: Settings,
    *,
    policy_base_url: str | None,
    send_api_key: bool = True,
) -> Outcome:
    """One ``/run`` episode for one task row, as a finished ``Outcome``; never raises for a
    failed episode (``CancelledError`` propagates). Arguments as for ``build_body``."""
    try:
        body = build_body(
            metadata, request_kwargs, settings, policy_base_url=policy_base_url, send_api_key=send_api_key
        )
    except Exception as error:
        instance_id = instance_id_of(metadata)
        return finish(failure_of(error, instance_id, scrubber_for(settings)), instance_id)
    return await run_body(body, settings)


async def run_body(body: dict[str, Any], settings: Settings) -> Outcome:
    """Send a body made by ``build_body``, classify the answer and finish the record."""
    instance_id = instance_id_of(body)
    scrubber = scrubber_for(settings)
    try:
        outcome = await send(
            body, settings, instance_id=instance_id, scrub=None if scrubber is None else scrubber.scrub
        )
    except Exception as error:
        outcome = failure_of(error, instance_id, scrubber)
    return finish(outcome, instance_id)


def not_started(error: Exception, metadata: Any) -> Outcome:
    """The finished ``Outcome`` of an episode that could not start (settings, routing)."""
    instance_id = instance_id_of(metadata)
    return finish(failure_of(error, instance_id), instance_id)


def failure_of(error: Exception, instance_id: str | None, scrubber: KeyScrubber | None = None) -> Outcome:
    """The failed ``Outcome`` for an exception raised on our side: a bad setting or request,
    else a defect (``client_error``, logged with its traceback)."""
    if isinstance(error, SettingsError):
        kind, reason = fk.INVALID_CONFIG, str(error)
    elif isinstance(error, (RequestBuildError, PolicyUrlError)):
        kind, reason = fk.INVALID_REQUEST, str(error)
    else:
        logger.error("miles-nemogym client error for %s", instance_id, exc_info=error)
        kind, reason = fk.CLIENT_ERROR, f"{type(error).__name__}: {error}"
    return failure(kind, reason if scrubber is None else scrubber.scrub_text(reason))


def finish(outcome: Outcome, instance_id: str | None) -> Outcome:
    """The last step of every episode: its own ``episode_id`` and the task's ``instance_id``."""
    outcome.record.episode_id = uuid.uuid4().hex
    if outcome.record.instance_id is None:
        outcome.record.instance_id = instance_id
    return outcome
