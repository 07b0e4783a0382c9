"""The HTTP client for NeMo-Gym's ``POST /run``: one pooled aiohttp session per event loop.

``/run`` is not idempotent, so a request is retried only when it certainly never reached
the server; answers are read as untrusted (size capped, API key scrubbed before parsing).
Why aiohttp, and the retry rule: docs/episode-pipeline.md.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import random
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from miles_nemogym import failure_kinds as fk
from miles_nemogym.episode.classify import Outcome, classify_http, failure
from miles_nemogym.episode.request import RequestBuildError, encode_body
from miles_nemogym.settings import Settings

logger = logging.getLogger(__name__)

# Below the NeMo-Gym server's own keep-alive (uvicorn timeout_keep_alive=30 s): reusing
# a connection the server is closing at that instant fails after the request may have
# left, which is a masked sample we could have avoided.
KEEPALIVE_S = 15.0

# Bodies above this are classified in a worker thread: a real result (about 100 KB) is
# classified quickly on the loop, a runaway one of 100 MB would stall it for seconds.
OFF_LOOP_BYTES = 4 * 1024 * 1024

# How long interpreter exit waits for the pools to close on their loops.
EXIT_CLOSE_TIMEOUT_S = 5.0


Scrub = Callable[[bytes], bytes]
"""Removes the policy API key from text that came from outside (``redaction.KeyScrubber``)."""


@dataclass
class Progress:
    """Where one ``post_run`` is, for ``abort``'s report and a cancelled episode's record."""

    attempts: int = 0
    """Attempts started: 0 means nothing was sent."""
    in_backoff: bool = False
    """Waiting to retry a request that certainly never reached the server."""


_PoolKey = tuple[int, float]
"""The settings a connection pool is built from: (connection limit, connect timeout)."""


class GymClient:
    """``/run`` over one keep-alive connection pool, bound to the loop that created it."""

    def __init__(self, settings: Settings) -> None:
        self._loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(
            limit=settings.max_concurrency,
            limit_per_host=0,
            keepalive_timeout=KEEPALIVE_S,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            # Per-request timeouts are set in post_run; no session-wide total.
            timeout=aiohttp.ClientTimeout(total=None),
            raise_for_status=False,
        )

    @property
    def closed(self) -> bool:
        return self._session.closed

    async def close(self) -> None:
        await self._session.close()

    async def post_run(
        self,
        url: str,
        body: dict[str, Any],
        settings: Settings,
        progress: Progress | None = None,
        *,
        instance_id: str | None = None,
        scrub: Scrub | None = None,
    ) -> Outcome:
        """Send one episode and classify the answer for ``instance_id``; ``scrub`` removes the
        API key from outside text. Never raises for transport or HTTP failures (they become
        a failed ``Outcome``); ``CancelledError`` propagates."""
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("GymClient used from an event loop it was not created in")
        progress = progress if progress is not None else Progress()
        try:
            payload = encode_body(body)
        except RequestBuildError as error:
            return failure(fk.INVALID_REQUEST, str(error))
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        started = self._loop.time()
        deadline = started + settings.run_timeout_s
        attempt = 0
        while True:
            attempt += 1
            progress.attempts, progress.in_backoff = attempt, False
            remaining = deadline - self._loop.time()
            timeout = aiohttp.ClientTimeout(total=max(remaining, 0.001), sock_connect=settings.connect_timeout_s)
            retry_kind: str | None = None
            try:
                async with self._session.post(
                    url, data=payload, headers=headers, timeout=timeout, allow_redirects=False
                ) as resp:
                    raw = await _read_capped(resp, settings.max_result_bytes)
                    if isinstance(raw, int):
                        outcome = failure(
                            fk.AGENT_RUN_ERROR,
                            f"the /run answer exceeds NEMO_GYM_MAX_RESULT_BYTES={settings.max_result_bytes} "
                            f"(at least {raw} bytes decoded); not read further",
                            http_status=resp.status,
                        )
                    elif len(raw) > OFF_LOOP_BYTES:
                        outcome = await self._loop.run_in_executor(
                            None, _classify, resp.status, raw, instance_id, settings, scrub
                        )
                    else:
                        outcome = _classify(resp.status, raw, instance_id, settings, scrub)
                    if not isinstance(raw, int):  # kept for the episode store (scrubbed there)
                        outcome.with_answer(raw, is_json=outcome.answer[1])
            except aiohttp.ConnectionTimeoutError as error:
                retry_kind, reason = fk.TRANSPORT_TIMEOUT, f"connect timeout: {_text(error, scrub)}"
            except aiohttp.ClientConnectorError as error:
                retry_kind, reason = fk.TRANSPORT_UNREACHABLE, f"cannot connect: {_text(error.os_error, scrub)}"
            except asyncio.TimeoutError:
                outcome = failure(
                    fk.AGENT_TIMEOUT,
                    f"no answer within NEMO_GYM_RUN_TIMEOUT={settings.run_timeout_s:g}s",
                )
            except (aiohttp.ClientError, OSError) as error:
                # Disconnects, resets, payload and protocol errors: the request may have
                # reached the server and started an episode.
                outcome = failure(fk.TRANSPORT_PEER_DROP, f"{type(error).__name__}: {_text(error, scrub)}")

            if retry_kind is not None:
                delay = _backoff(attempt, settings)
                if attempt >= settings.retry_attempts or self._loop.time() + delay >= deadline:
                    outcome = failure(retry_kind, f"{reason} (after {attempt} attempts)")
                else:
                    logger.debug("/run not delivered (%s); retry %d in %.1fs", reason, attempt, delay)
                    progress.in_backoff = True
                    await asyncio.sleep(delay)
                    continue
            outcome.record.attempts = attempt
            outcome.record.elapsed_s = round(self._loop.time() - started, 3)
            return outcome


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


def _classify(status: int, raw: bytes, instance_id: str | None, settings: Settings, scrub: Scrub | None) -> Outcome:
    return classify_http(status, raw, instance_id=instance_id, reward_range=settings.reward_range, scrub=scrub)


def _text(error: object, scrub: Scrub | None) -> str:
    text = str(error)
    return text if scrub is None else scrub(text.encode("utf-8", "backslashreplace")).decode("utf-8", "replace")


def _backoff(attempt: int, settings: Settings) -> float:
    """Full-jitter exponential backoff: spreads a fleet of retrying samples apart."""
    cap = min(settings.retry_backoff_max_s, settings.retry_backoff_s * 2 ** (attempt - 1))
    return random.uniform(0, cap)


# Keyed by loop, then by pool settings: a client is never shared across loops, and a
# settings change gets a new pool without breaking requests in flight on the old one.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_PoolKey, GymClient]] = weakref.WeakKeyDictionary()


async def get_client(settings: Settings) -> GymClient:
    """This loop's client for these pool settings, created on first use."""
    loop = asyncio.get_running_loop()
    pools = _clients.get(loop)
    if pools is None:
        pools = _clients.setdefault(loop, {})
    key = (settings.max_concurrency, settings.connect_timeout_s)
    client = pools.get(key)
    if client is None or client.closed:
        client = pools[key] = GymClient(settings)
        _register_exit_close()
    return client


async def close_client() -> None:
    """Close this loop's clients (tests and CLI shutdown; Miles never needs to)."""
    for client in _clients.pop(asyncio.get_running_loop(), {}).values():
        await client.close()


_exit_registered = threading.Event()


def _register_exit_close() -> None:
    if not _exit_registered.is_set():
        _exit_registered.set()
        atexit.register(close_at_exit)


async def _close_all(clients: list[GymClient]) -> None:
    for client in clients:
        await client.close()


def close_at_exit() -> None:
    """Close every loop's pools at interpreter exit, on their own loops: Miles runs its loop
    forever on a daemon thread (``miles/utils/async_utils.py`` at 31f1ca9), so nothing else
    closes them and aiohttp would report "Unclosed connector"."""
    for loop, pools in list(_clients.items()):
        clients = [client for client in pools.values() if not client.closed]
        if not clients or loop.is_closed():
            continue
        try:
            if loop.is_running():
                future = asyncio.run_coroutine_threadsafe(_close_all(clients), loop)
                future.result(timeout=EXIT_CLOSE_TIMEOUT_S)
            else:
                loop.run_until_complete(_close_all(clients))
        except Exception as error:  # exit must go on; the warning is all that is lost
            logger.debug("could not close the NeMo-Gym connection pool at exit: %r", error)


def open_pools() -> int:
    """How many open ``/run`` connection pools this event loop holds (one per pool settings)."""
    return sum(not pool.closed for pool in _clients.get(asyncio.get_running_loop(), {}).values())
