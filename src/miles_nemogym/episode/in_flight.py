"""The process's in-flight NeMo-Gym episodes: run one, or abort them all.

Miles' over-sampling abort stops generation and then calls the agent module's
``abort(args)`` so external episodes stop too (``call_agent_abort_hook`` in Miles'
``miles/utils/misc.py``, radixark/miles 31f1ca9). NeMo-Gym has no cancel
endpoint; what a client can do is stop waiting and close the connection (the server's
sandbox is reclaimed by its provider's TTL). Each episode therefore runs its HTTP call in
an inner task registered here, and ``abort_all`` cancels those tasks, from any thread,
while the callers' own tasks receive a ``cancelled`` outcome instead of an exception.
The inner task also holds the wait on the server's circuit (``episode/circuit.py``), so an
episode waiting out an outage is aborted like one in flight.

A cancellation of the caller's task (Miles cancelling the rollout) is different: it is
propagated unchanged after the inner request is closed, as asyncio's contract requires.
The two are told apart by where the cancellation lands: the caller waits on a future the
inner task resolves when it ends, so ``abort`` cancelling the inner task resumes the
caller normally, and only the caller's own cancellation raises there (this works on
Python 3.10, which has no ``Task.cancelling``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from miles_nemogym import failure_kinds as fk
from miles_nemogym.episode.circuit import circuit
from miles_nemogym.episode.classify import Outcome, failure
from miles_nemogym.episode.client import GymClient, Progress, get_client
from miles_nemogym.rollout.ledger import ledger
from miles_nemogym.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _InFlight:
    task: asyncio.Task[Outcome]
    loop: asyncio.AbstractEventLoop
    progress: Progress = field(default_factory=Progress)


_lock = threading.Lock()
_in_flight: set[_InFlight] = set()


def in_flight_count() -> int:
    with _lock:
        return len(_in_flight)


async def run_episode(body: dict[str, Any], settings: Settings) -> Outcome:
    """POST one episode to ``/run`` and classify it; see the module docstring on cancellation."""
    client = await get_client(settings)
    loop = asyncio.get_running_loop()
    started = loop.time()
    progress = Progress()
    task = loop.create_task(_deliver(client, body, settings, progress))
    entry = _InFlight(task, loop, progress)
    with _lock:
        _in_flight.add(entry)
    instance_id = body.get("instance_id")
    try:
        try:
            await _ended(task)
        except asyncio.CancelledError:
            # The caller's own cancellation: close the request, then propagate it.
            task.cancel()
            await _ended(task)
            raise
        if task.cancelled():
            outcome = failure(fk.CANCELLED, _stopped_reason(progress), instance_id=instance_id)
            outcome.record.attempts = progress.attempts
            outcome.record.elapsed_s = round(loop.time() - started, 3)
            return outcome
        error = task.exception()
        if error is not None:
            logger.error("miles-nemogym client error for %s", instance_id, exc_info=error)
            return failure(fk.CLIENT_ERROR, f"{type(error).__name__}: {error}", instance_id=instance_id)
        outcome = task.result()
    finally:
        with _lock:
            _in_flight.discard(entry)
    if outcome.record.instance_id is None:
        outcome.record.instance_id = instance_id
    return outcome


# Failures that certainly never reached the server: safe to send again once it answers.
_UNDELIVERED = frozenset({fk.TRANSPORT_UNREACHABLE, fk.TRANSPORT_TIMEOUT})


async def _deliver(client: GymClient, body: dict[str, Any], settings: Settings, progress: Progress) -> Outcome:
    """``/run`` through the process's circuit: an undeliverable request opens it, waits
    for the server, and is sent again (it never arrived); see ``episode/circuit.py``."""
    waited = 0.0
    attempts = 0
    try:
        while True:
            if circuit.is_open or circuit.stop_error() is not None:
                progress.in_backoff = True  # waiting: nothing of this try was delivered
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
            outcome = await client.post_run(settings.run_url, body, settings, progress)
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


def _ended(task: asyncio.Task[Outcome]) -> asyncio.Future[None]:
    """A future resolved when ``task`` ends, however it ends; cancelling it leaves ``task``
    running (``asyncio.wait`` for one task, without its per-call set and closure)."""
    ended: asyncio.Future[None] = task.get_loop().create_future()

    def resolve(_: asyncio.Task[Outcome]) -> None:
        if not ended.done():
            ended.set_result(None)

    if task.done():
        ended.set_result(None)
    else:
        task.add_done_callback(resolve)
    return ended


def _stopped_reason(progress: Progress) -> str:
    if progress.attempts == 0 or progress.in_backoff:
        return "stopped by abort() before the request reached the server"
    return "stopped by abort() while waiting for the result; the server-side episode may run on"


AWAITING_RESULT = "awaiting_result"
"""An in-flight episode whose request was sent (or was being sent)."""
NOT_DELIVERED = "not_delivered"
"""An in-flight episode waiting to retry a request that never reached the server."""


def abort_all() -> Counter[str]:
    """Cancel every in-flight episode of this process; returns how many were stopped, by
    state (``AWAITING_RESULT``, ``NOT_DELIVERED``)."""
    with _lock:
        entries = list(_in_flight)
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    states: Counter[str] = Counter()
    for entry in entries:
        progress = entry.progress
        states[NOT_DELIVERED if progress.attempts == 0 or progress.in_backoff else AWAITING_RESULT] += 1
        if entry.loop is running:
            entry.task.cancel()
        elif not entry.loop.is_closed():
            entry.loop.call_soon_threadsafe(entry.task.cancel)
    return states
