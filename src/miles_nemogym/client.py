"""The HTTP client for NeMo-Gym's ``POST /run``: one pooled aiohttp session per event loop.

A rollout step opens hundreds of ``/run`` requests at once and each stays open for the
whole episode (minutes), in the event loop Miles also uses for its session server.
Measured with ``bench/agent_bench.py`` on a 2-core machine (1,000 requests held 10 s;
4,000 quick calls at concurrency 256): one ``aiohttp.ClientSession`` finished the burst
in ~11 s with loop stalls under 0.5 s and costs ~0.5 ms CPU per call; one pooled
``httpx.AsyncClient`` configured as Miles' Harbor connector finished in ~13 s but costs
~5 ms CPU per call (httpcore re-checks every pooled connection on each request), so it
saturates near 190 calls/s against ~2,000; a new httpx client per call (the upstream
example) took 40 s and stalled the loop 28 s. Hence aiohttp: one session and one
``TCPConnector`` per loop, with the pool as large as the configured concurrency so no
episode waits silently behind a pool limit.

Retries follow one rule, because ``/run`` is not idempotent (a re-sent request starts a
second paid episode against the same Miles session): a request is retried only when it
certainly never reached the server (connection refused or unreachable, connect
timeout). Anything that may have been delivered (reset, disconnect, timeout while
waiting for the answer, any HTTP status) is classified and returned, never re-sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import weakref
from dataclasses import dataclass
from typing import Any

import aiohttp
import pydantic_core

from miles_nemogym import failure_kinds as fk
from miles_nemogym.outcome import Outcome, classify_http, failure
from miles_nemogym.settings import Settings

logger = logging.getLogger(__name__)

# Below the NeMo-Gym server's own keep-alive (uvicorn timeout_keep_alive=30 s): reusing
# a connection the server is closing at that instant fails after the request may have
# left, which is a masked sample we could have avoided.
KEEPALIVE_S = 15.0


@dataclass(frozen=True)
class _PoolKey:
    """The settings a connection pool is built from."""

    limit: int
    connect_timeout_s: float


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

    async def post_run(self, url: str, body: dict[str, Any], settings: Settings) -> Outcome:
        """Send one episode and classify the answer. Never raises for transport or HTTP
        failures (they become a failed ``Outcome``); ``CancelledError`` propagates."""
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("GymClient used from an event loop it was not created in")
        # pydantic-core's encoder: ~3x faster than json.dumps on a task row; build_run_body
        # has already checked the body holds only finite JSON values.
        payload = pydantic_core.to_json(body)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        started = self._loop.time()
        deadline = started + settings.run_timeout_s
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - self._loop.time()
            timeout = aiohttp.ClientTimeout(total=max(remaining, 0.001), sock_connect=settings.connect_timeout_s)
            retry_kind: str | None = None
            try:
                async with self._session.post(
                    url, data=payload, headers=headers, timeout=timeout, allow_redirects=False
                ) as resp:
                    raw = scrub(await resp.read(), settings)
                    outcome = classify_http(resp.status, raw)
                    outcome.with_answer(raw, is_json=outcome.answer[1])
            except aiohttp.ConnectionTimeoutError as error:
                retry_kind, reason = fk.TRANSPORT_TIMEOUT, f"connect timeout: {_text(error, settings)}"
            except aiohttp.ClientConnectorError as error:
                retry_kind, reason = fk.TRANSPORT_UNREACHABLE, f"cannot connect: {_text(error.os_error, settings)}"
            except asyncio.TimeoutError:
                outcome = failure(
                    fk.AGENT_TIMEOUT,
                    f"no answer within NEMO_GYM_RUN_TIMEOUT={settings.run_timeout_s:g}s",
                )
            except (aiohttp.ClientError, OSError) as error:
                # Disconnects, resets, payload and protocol errors: the request may have
                # reached the server and started an episode.
                outcome = failure(fk.TRANSPORT_PEER_DROP, f"{type(error).__name__}: {_text(error, settings)}")

            if retry_kind is not None:
                delay = _backoff(attempt, settings)
                if attempt >= settings.retry_attempts or self._loop.time() + delay >= deadline:
                    outcome = failure(retry_kind, f"{reason} (after {attempt} attempts)")
                else:
                    logger.debug("/run not delivered (%s); retry %d in %.1fs", reason, attempt, delay)
                    await asyncio.sleep(delay)
                    continue
            outcome.record.attempts = attempt
            outcome.record.elapsed_s = round(self._loop.time() - started, 3)
            return outcome


def scrub(raw: bytes, settings: Settings) -> bytes:
    """``raw`` with the policy API key removed, before anything quotes or truncates it
    (a key cut in half by truncation would no longer match a later redaction)."""
    if settings.policy_api_key is None:
        return raw
    key = settings.policy_api_key.get_secret_value()
    for form in {key, json.dumps(key)[1:-1]}:
        raw = raw.replace(form.encode(), b"***")
    return raw


def _text(error: object, settings: Settings) -> str:
    return scrub(str(error).encode(), settings).decode("utf-8", "replace")


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
    pools = _clients.setdefault(loop, {})
    key = _PoolKey(settings.max_concurrency, settings.connect_timeout_s)
    client = pools.get(key)
    if client is None or client.closed:
        client = pools[key] = GymClient(settings)
    return client


async def close_client() -> None:
    """Close this loop's clients (tests and CLI shutdown; Miles never needs to)."""
    for client in _clients.pop(asyncio.get_running_loop(), {}).values():
        await client.close()
