"""Run one episode to its finished ``Outcome``: a ``/run`` body, or any attempt function.

``/run`` is not idempotent: a body is sent again only when it certainly never reached the
server, and only after that server's circuit (``circuit.py``) has waited the outage out;
``run_attempts`` applies the same rule to an environment episode (``episode/environment.py``).
Each episode runs in an inner task registered here, so ``abort_all`` (Miles' over-sampling
abort, from any thread) stops it while its caller gets a ``cancelled`` outcome; the caller's
own cancellation propagates. Requests share one pooled aiohttp session per event loop (and
one ``simple_agent.Connections``), closed when that loop shuts down. Why each rule:
docs/episode-pipeline.md.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import weakref
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from miles_nemogym import failure_kinds as fk
from miles_nemogym.episode.circuit import Circuit, circuit
from miles_nemogym.episode.outcome import Outcome, classify_http, failure, failure_of, finish
from miles_nemogym.episode.request import RunBody
from miles_nemogym.redaction import redact_url
from miles_nemogym.settings import Settings
from miles_nemogym.simple_agent import Connections

__all__ = [
    "AWAITING_RESULT",
    "NOT_DELIVERED",
    "Undelivered",
    "abort_all",
    "close_client",
    "environment_connections",
    "open_pools",
    "run_attempts",
    "run_body",
]

logger = logging.getLogger(__name__)

# Below the NeMo-Gym server's own keep-alive (uvicorn timeout_keep_alive=30 s): reusing
# a connection the server is closing at that instant fails after the request may have
# left, which is a masked sample we could have avoided.
_KEEPALIVE_S = 15.0

# Bodies above this are classified in a worker thread: a real result (about 100 KB) is
# classified quickly on the loop, a runaway one of 100 MB would stall it for seconds.
_OFF_LOOP_BYTES = 4 * 1024 * 1024

# How long interpreter exit waits for the pools to close on their loops.
_EXIT_CLOSE_TIMEOUT_S = 5.0

_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}

AWAITING_RESULT = "awaiting_result"
"""An in-flight episode whose request was sent (or was being sent)."""
NOT_DELIVERED = "not_delivered"
"""An in-flight episode whose request has not reached the server (waiting out an outage)."""


@dataclass(frozen=True)
class Undelivered:
    """A try that certainly never reached the server: safe to send again."""

    kind: str
    reason: str


Attempt = Callable[[], Awaitable["Outcome | Undelivered"]]
"""One try of an episode: its outcome, or ``Undelivered`` (then it is tried again)."""


async def run_body(body: RunBody, settings: Settings) -> Outcome:
    """Send ``body`` to ``/run`` and return the episode's finished ``Outcome``; never raises for
    a failed episode (a defect becomes ``client_error``); ``CancelledError`` propagates."""

    async def attempt() -> Outcome | Undelivered:
        return await _post(await _session(settings), body, settings)

    return await run_attempts(attempt, circuit.for_url(settings.gym_url, "NEMO_GYM_URL"), settings, body.instance_id)


async def run_attempts(attempt: Attempt, server: Circuit, settings: Settings, instance_id: str | None) -> Outcome:
    """Run ``attempt`` as one abortable episode behind ``server``'s circuit: an ``Undelivered``
    try trips it and is tried again once it closes. The finished ``Outcome``; never raises for a
    failed episode (a defect becomes ``client_error``); ``CancelledError`` propagates."""
    try:
        outcome = await _send(lambda entry: _deliver(attempt, server, settings, entry))
    except Exception as error:
        outcome = failure_of(error, instance_id, settings.key_scrubber())
    return finish(outcome, instance_id)


# -- the in-flight registry: abort ----------------------------------------------------------


@dataclass(eq=False)
class _InFlight:
    """Where one episode's send is, for ``abort_all``'s report and a cancelled record."""

    task: asyncio.Task[Outcome] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    attempts: int = 0
    """Requests started: 0 means nothing was sent."""
    not_delivered: bool = True
    """Nothing of the current try has reached the server (before it, or waiting out an outage)."""
    outage_wait_s: float = 0.0


_lock = threading.Lock()
_in_flight: set[_InFlight] = set()


async def _send(deliver: Callable[[_InFlight], Coroutine[Any, Any, Outcome]]) -> Outcome:
    """``deliver`` in an inner task that ``abort_all`` may cancel: then a ``cancelled`` outcome."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    entry = _InFlight(loop=loop)
    task = entry.task = loop.create_task(deliver(entry))
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
        if not task.cancelled():
            return task.result()
        if entry.not_delivered:
            reason = "stopped by abort() before the request reached the server"
        else:
            reason = "stopped by abort() while waiting for the result; the server-side episode may run on"
        outcome = failure(fk.CANCELLED, reason)
        outcome.record.attempts = entry.attempts
        outcome.record.elapsed_s = round(loop.time() - started, 3)
        outcome.outage_wait_s = entry.outage_wait_s
        return outcome
    finally:
        with _lock:
            _in_flight.discard(entry)


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
        if entry.task is None or entry.loop is None:
            continue
        states[NOT_DELIVERED if entry.not_delivered else AWAITING_RESULT] += 1
        if entry.loop is running:
            entry.task.cancel()
        elif not entry.loop.is_closed():
            entry.loop.call_soon_threadsafe(entry.task.cancel)
    return states


# -- delivery: the circuit's wait and the one resend rule -------------------------------------


async def _deliver(attempt: Attempt, server: Circuit, settings: Settings, entry: _InFlight) -> Outcome:
    """Wait while the circuit is open, try once; a try that never reached the server trips
    the circuit and is tried again once it closes, until ``NEMO_GYM_OUTAGE_TIMEOUT``."""
    loop = asyncio.get_running_loop()
    last: Undelivered | None = None
    started: float | None = None
    while True:
        entry.not_delivered = True
        gave_up_kind, waited = await server.wait()
        entry.outage_wait_s += waited
        if gave_up_kind is not None:
            kind = last.kind if last is not None else gave_up_kind
            outcome = failure(
                kind,
                f"the NeMo-Gym server {redact_url(server.url)} could not be reached within NEMO_GYM_OUTAGE_TIMEOUT="
                f"{settings.outage_timeout_s:g}s (this episode waited {entry.outage_wait_s:.0f}s)"
                + (f"; last try: {last.reason}" if last is not None else ""),
            )
            break
        entry.attempts += 1
        entry.not_delivered = False
        if started is None:
            started = loop.time()
        result = await attempt()
        if isinstance(result, Undelivered):
            last = result
            server.trip(settings.outage_timeout_s, result.kind, result.reason)
            continue
        server.delivered()
        outcome = result
        break
    outcome.record.attempts = entry.attempts
    outcome.record.elapsed_s = round(loop.time() - started, 3) if started is not None else 0.0
    outcome.outage_wait_s = entry.outage_wait_s
    return outcome


async def _post(session: aiohttp.ClientSession, body: RunBody, settings: Settings) -> Outcome | Undelivered:
    """One ``POST /run``: the classified answer, a failure that may have been delivered, or
    ``Undelivered``. Never raises for transport or HTTP failures."""
    scrubber = settings.key_scrubber()
    scrub = None if scrubber is None else scrubber.scrub
    timeout = aiohttp.ClientTimeout(total=settings.run_timeout_s, sock_connect=settings.connect_timeout_s)
    try:
        async with session.post(
            settings.run_url, data=body.payload, headers=_HEADERS, timeout=timeout, allow_redirects=False
        ) as resp:
            raw = await _read_capped(resp, settings.max_result_bytes)
            if isinstance(raw, int):
                return failure(
                    fk.AGENT_RUN_ERROR,
                    f"the /run answer exceeds NEMO_GYM_MAX_RESULT_BYTES={settings.max_result_bytes} "
                    f"(at least {raw} bytes decoded); not read further",
                    http_status=resp.status,
                )
            classify = _classifier(resp.status, raw, body.instance_id, settings, scrub)
            if len(raw) > _OFF_LOOP_BYTES:
                outcome = await asyncio.get_running_loop().run_in_executor(None, classify)
            else:
                outcome = classify()
            outcome.answer = raw  # kept for the episode store (scrubbed there)
            return outcome
    except aiohttp.ConnectionTimeoutError as error:
        return Undelivered(fk.TRANSPORT_TIMEOUT, f"connect timeout: {_text(error, scrub)}")
    except aiohttp.ClientSSLError as error:
        # The TLS handshake failed (a certificate refused, expired, for another host): no
        # byte of the request left. Its own kind: waiting helps only once it is fixed.
        return Undelivered(fk.TRANSPORT_TLS, f"TLS: {_text(error.os_error, scrub)}")
    except aiohttp.ClientConnectorError as error:
        return Undelivered(fk.TRANSPORT_UNREACHABLE, f"cannot connect: {_text(error.os_error, scrub)}")
    except asyncio.TimeoutError:
        return failure(fk.AGENT_TIMEOUT, f"no answer within NEMO_GYM_RUN_TIMEOUT={settings.run_timeout_s:g}s")
    except (aiohttp.ClientError, OSError) as error:
        # Disconnects, resets, payload and protocol errors: the request may have
        # reached the server and started an episode.
        return failure(fk.TRANSPORT_PEER_DROP, f"{type(error).__name__}: {_text(error, scrub)}")


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes | int:
    """The decoded body, or the byte count at which it passed ``cap``."""
    if resp.content_length is not None and not resp.headers.get("Content-Encoding"):
        if resp.content_length > cap:
            return resp.content_length
        return await resp.read()  # its length is known and allowed: one read, not a chunk loop
    chunks = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > cap:
            return size
        chunks.append(chunk)
    return b"".join(chunks)


def _classifier(
    status: int, raw: bytes, instance_id: str | None, settings: Settings, scrub: Callable[[bytes], bytes] | None
) -> Callable[[], Outcome]:
    return lambda: classify_http(status, raw, instance_id=instance_id, reward_range=settings.reward_range, scrub=scrub)


def _text(error: object, scrub: Callable[[bytes], bytes] | None) -> str:
    text = str(error)
    return text if scrub is None else scrub(text.encode("utf-8", "backslashreplace")).decode("utf-8", "replace")


# -- the connection pools: one per event loop and pool settings ------------------------------


@dataclass
class _Pools:
    """One loop's sessions, by (connection limit, connect timeout), its environment episodes'
    ``Connections``, and the async generator whose finalisation at the loop's shutdown
    (``asyncio.run``) closes them."""

    sessions: dict[tuple[int, float], aiohttp.ClientSession] = field(default_factory=dict)
    connections: Connections | None = None
    guard: AsyncGenerator[None, None] | None = None


# Keyed by loop: a session is never shared across loops, and a settings change gets a new
# session without breaking requests in flight on the old one.
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pools] = weakref.WeakKeyDictionary()


async def _loop_pools() -> _Pools:
    """This loop's pools, closed when the loop shuts down (and at interpreter exit)."""
    loop = asyncio.get_running_loop()
    pools = _pools.get(loop)
    if pools is None:
        pools = _pools[loop] = _Pools()
    if pools.guard is None:
        pools.guard = _closed_at_shutdown(pools)
        await pools.guard.__anext__()  # the loop now tracks it (loop.shutdown_asyncgens)
        _register_exit_close()
    return pools


async def environment_connections() -> Connections:
    """This loop's ``Connections`` for environment episodes, opened on first use."""
    pools = await _loop_pools()
    if pools.connections is None:
        pools.connections = await Connections().__aenter__()
    return pools.connections


async def _session(settings: Settings) -> aiohttp.ClientSession:
    """This loop's session for these pool settings, created on first use."""
    pools = await _loop_pools()
    key = (settings.max_concurrency, settings.connect_timeout_s)
    session = pools.sessions.get(key)
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(
            limit=settings.max_concurrency, limit_per_host=0, keepalive_timeout=_KEEPALIVE_S
        )
        # Per-request timeouts are set in _post; no session-wide total.
        session = pools.sessions[key] = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None), raise_for_status=False
        )
    return session


async def _closed_at_shutdown(pools: _Pools) -> AsyncGenerator[None, None]:
    """Suspended until its loop shuts down its async generators (``asyncio.run`` does, before
    closing the loop), then closes the loop's sessions there: no "Unclosed client session"."""
    try:
        yield
    finally:
        await _close_all(pools)


async def _close_all(pools: _Pools) -> None:
    sessions = list(pools.sessions.values())
    pools.sessions.clear()
    connections, pools.connections = pools.connections, None
    for session in sessions:
        await session.close()
    if connections is not None:
        await connections.close()


async def close_client() -> None:
    """Close this loop's sessions (tests and CLI shutdown; Miles never needs to)."""
    pools = _pools.pop(asyncio.get_running_loop(), None)
    if pools is not None:
        await _close_all(pools)
        if pools.guard is not None:
            await pools.guard.aclose()


def open_pools() -> int:
    """How many open pools this event loop holds: ``/run`` sessions (one per pool settings) and
    the environment episodes' ``Connections``."""
    pools = _pools.get(asyncio.get_running_loop())
    if pools is None:
        return 0
    return sum(not session.closed for session in pools.sessions.values()) + (pools.connections is not None)


_exit_registered = threading.Event()


def _register_exit_close() -> None:
    if not _exit_registered.is_set():
        _exit_registered.set()
        atexit.register(_close_at_exit)


def _close_at_exit() -> None:
    """Close every loop's sessions at interpreter exit, on their own loops: Miles runs its loop
    forever on a daemon thread (``miles/utils/async_utils.py`` at 31f1ca9), which never shuts
    down its async generators, and aiohttp would report "Unclosed connector"."""
    for loop, pools in list(_pools.items()):
        if not (pools.sessions or pools.connections) or loop.is_closed():
            continue
        try:
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(_close_all(pools), loop).result(timeout=_EXIT_CLOSE_TIMEOUT_S)
            else:
                loop.run_until_complete(_close_all(pools))
        except Exception as error:  # exit must go on; the warning is all that is lost
            logger.debug("could not close the NeMo-Gym connection pool at exit: %r", error)
