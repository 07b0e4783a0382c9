"""Stop the training run when the NeMo-Gym server cannot produce episodes.

The group filter calls ``check()`` first: its exception is the one that leaves Miles'
rollout (Miles ``inference_rollout_train.py``). It raises after an outage past
``NEMO_GYM_OUTAGE_TIMEOUT`` or ``NEMO_GYM_MAX_FAILURE_STREAK`` failures in a row, having
stopped this process's in-flight episodes (docs/episode-pipeline.md).
"""

from __future__ import annotations

import logging

from miles_nemogym.episode.circuit import circuit
from miles_nemogym.episode.in_flight import abort_all
from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.redaction import redact_url
from miles_nemogym.rollout.ledger import ledger
from miles_nemogym.settings import Settings

logger = logging.getLogger(__name__)


class RunStopped(MilesNemoGymError, RuntimeError):
    """The run cannot go on: the message says why and what to do."""


def stop_reason(settings: Settings) -> str | None:
    """Why the run must stop now, or None. Reads process state; changes nothing."""
    outage = circuit.stop_error()
    if outage is not None:
        return outage
    limit = settings.max_failure_streak
    if limit:
        count, kinds = ledger.streak()
        if count >= limit:
            seen = ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
            return (
                f"{count} NeMo-Gym episodes in a row failed with no valid one between them "
                f"(NEMO_GYM_MAX_FAILURE_STREAK={limit}): {seen}. The run stops; fix the server at "
                f"{redact_url(settings.gym_url)} (see the failure kinds in the README) and resume from the last "
                "checkpoint, or set NEMO_GYM_MAX_FAILURE_STREAK=0 to never stop"
            )
    return None


def check(settings: Settings) -> None:
    """Raise ``RunStopped`` (after stopping in-flight episodes) if the run must stop."""
    reason = stop_reason(settings)
    if reason is None:
        return
    stopped = sum(abort_all().values())
    logger.error("%s (stopped %d in-flight episode(s))", reason, stopped)
    raise RunStopped(reason)
