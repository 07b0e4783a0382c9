"""The process's in-flight NeMo-Gym episodes: send one through the circuit, or abort them all.

Each ``/run`` runs in an inner task registered here so that ``abort_all`` (Miles'
over-sampling abort, from any thread) can stop it while its caller gets a ``cancelled``
outcome; a cancellation of the caller's own task propagates. How the two are told apart
(also on Python 3.10): docs/episode-pipeline.md.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from miles_nemogym import failure_kinds as fk
from miles_nemogym.episode.circuit import circuit
from miles_nemogym.episode.classify import Outcome, failure
from miles_nemogym.episode.client import GymClient, Progress, Scrub, get_client
from miles_nemogym.rollout.ledger import ledger
from miles_nemogym.settings import Settings


@dataclass(eq=False)
class _InFlight:
    task: asyncio.Task[Outcome]
    loop: asyncio.AbstractEventLoop
    progress: Progress = field(default_factory=Progress)


_lock = threading.Lock()
_in_flight: set[_InFlight] = set()


async def send(body: dict[str, Any], settings: Settings, *, instance_id: str | None, scrub: Scrub | None) -> Outcome:
    """POST one episode and classify it; ``abort_all`` turns it into a ``cancelled`` outcome.
    Raises what the request raised (a defect); the caller's cancellation propagates."""
    client = await get_client(settings)
    loop = asyncio.get_running_loop()
    started = loop.time()
    progress = Progress()
    task = loop.create_task(_deliver(client, body, settings, progress, instance_id, scrub))
    entry = _InFlight(task, loop, progress)
    with _lock:
        _in_flight.add(entry)
    try:
        try:
            await _ended(task)
        except asyncio.CancelledError:
            # The caller's own cancellation: close the request, then propagate it.
            task.cancel()
            await _ended(task)
            raise
        if task.cancelled():
            outcome = failure(fk.CANCELLED, _stopped_reason(progress))
            outcome.record.attempts = progress.attempts
            outcome.record.elapsed_s = round(loop.time() - started, 3)
            return outcome
        return task.result()
    finally:
        with _lock:
            _in_flight.discard(entry)


# Failures that certainly never reached the server: safe to send again once it answers.
_UNDELIVERED = frozenset({fk.TRANSPORT_UNREACHABLE, fk.TRANSPORT_TIMEOUT})


async def _deliver(
    client: GymClient,
    body: dict[str, Any],
    settings: Settings,
    progress: Progress,
    instance_id: str | None,
    scrub: Scrub | None,
) -> Outcome:
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
            outcome = await client.post_run(
                settings.run_url, body, settings, progress, instance_id=instance_id, scrub=scrub
            )
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
