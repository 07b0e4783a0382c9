"""The process's in-flight NeMo-Gym episodes: run one, or abort them all.

Miles' over-sampling abort stops generation and then calls the agent module's
``abort(args)`` so external episodes stop too (``call_agent_abort_hook`` in Miles'
``miles/utils/misc.py``, radixark/miles 31f1ca9). NeMo-Gym has no cancel
endpoint; what a client can do is stop waiting and close the connection (the server's
sandbox is reclaimed by its provider's TTL). Each episode therefore runs its HTTP call in
an inner task registered here, and ``abort_all`` cancels those tasks, from any thread,
while the callers' own tasks receive a ``cancelled`` outcome instead of an exception.
The inner task also holds the wait on the server's circuit (``circuit.py``), so an
episode waiting out an outage is aborted like one in flight.

A cancellation of the caller's task (Miles cancelling the rollout) is different: it is
propagated unchanged after the inner request is closed, as asyncio's contract requires.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

from miles_nemogym import failure_kinds as fk
from miles_nemogym.circuit import circuit
from miles_nemogym.client import GymClient, get_client
from miles_nemogym.ledger import ledger
from miles_nemogym.outcome import Outcome, failure
from miles_nemogym.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _InFlight:
    task: asyncio.Task[Outcome]
    loop: asyncio.AbstractEventLoop
    aborted: bool = False


_lock = threading.Lock()
_in_flight: set[_InFlight] = set()


def in_flight_count() -> int:
    with _lock:
        return len(_in_flight)


async def run_episode(body: dict[str, Any], settings: Settings) -> Outcome:
    """POST one episode to ``/run`` and classify it; see the module docstring on cancellation."""
    client = await get_client(settings)
    loop = asyncio.get_running_loop()
    task = loop.create_task(_deliver(client, body, settings))
    entry = _InFlight(task, loop)
    with _lock:
        _in_flight.add(entry)
    instance_id = body.get("instance_id")
    try:
        outcome = await task
    except asyncio.CancelledError:
        # Awaiting the inner task means a cancellation of the caller cancels it too and
        # arrives here only once the request is closed. Only abort()'s own cancellation
        # becomes an outcome; the caller's always propagates.
        if not (entry.aborted and task.cancelled()) or _caller_cancelled():
            raise
        return failure(fk.CANCELLED, "stopped by abort()", instance_id=instance_id)
    except Exception as error:
        logger.error("miles-nemogym client error for %s", instance_id, exc_info=error)
        return failure(fk.CLIENT_ERROR, f"{type(error).__name__}: {error}", instance_id=instance_id)
    finally:
        with _lock:
            _in_flight.discard(entry)
    if outcome.record.instance_id is None:
        outcome.record.instance_id = instance_id
    return outcome


# Failures that certainly never reached the server: safe to send again once it answers.
_UNDELIVERED = frozenset({fk.TRANSPORT_UNREACHABLE, fk.TRANSPORT_TIMEOUT})


async def _deliver(client: GymClient, body: dict[str, Any], settings: Settings) -> Outcome:
    """``/run`` through the process's circuit: an undeliverable request opens it, waits
    for the server, and is sent again (it never arrived); see ``circuit.py``."""
    waited = 0.0
    attempts = 0
    try:
        while True:
            reachable, seconds = await circuit.wait()
            waited += seconds
            if not reachable:
                outcome = failure(
                    fk.TRANSPORT_UNREACHABLE,
                    f"the NeMo-Gym server stayed unreachable past NEMO_GYM_OUTAGE_TIMEOUT="
                    f"{settings.outage_timeout_s:g}s (this episode waited {waited:.0f}s)",
                )
                outcome.record.attempts = attempts
                return outcome
            outcome = await client.post_run(settings.run_url, body, settings)
            attempts += outcome.record.attempts
            if outcome.record.failure_kind in _UNDELIVERED and outcome.record.http_status is None:
                circuit.trip(settings.gym_url, settings.outage_timeout_s)
                continue
            circuit.delivered()
            outcome.record.attempts = attempts
            return outcome
    finally:
        if waited:
            ledger.add_outage_wait(waited)


def _caller_cancelled() -> bool:
    """Whether the running task itself was asked to cancel (Python 3.11+ can tell)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else False


def abort_all() -> int:
    """Cancel every in-flight episode of this process; returns how many were stopped."""
    with _lock:
        entries = list(_in_flight)
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    for entry in entries:
        entry.aborted = True
        if entry.loop is running:
            entry.task.cancel()
        elif not entry.loop.is_closed():
            entry.loop.call_soon_threadsafe(entry.task.cancel)
    return len(entries)
