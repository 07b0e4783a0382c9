"""One process-wide circuit for the NeMo-Gym server: episodes wait out an outage.

Closed: send. Open (after an undeliverable ``/run``): wait while one task probes the server
with a TCP connection. Given up (after ``NEMO_GYM_OUTAGE_TIMEOUT``): fail, and
``stop_error()`` stops the run. Thread-safe; why: docs/episode-pipeline.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from urllib.parse import urlsplit

from miles_nemogym.redaction import redact_url

logger = logging.getLogger(__name__)

WARN_EVERY_S = 60.0
PROBE_BACKOFF_S = 0.5
PROBE_BACKOFF_MAX_S = 15.0
RECHECK_S = 10.0


class Circuit:
    """Closed (send), open (wait and probe) or given up (fail, stop the run)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._opened_at: float | None = None
        self._url = ""
        self._timeout_s = 0.0
        self._gave_up: str | None = None
        self._probing = False
        self._waiting = 0
        self._wakeups: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}
        self._probe_task: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._opened_at is not None

    def waiting(self) -> int:
        with self._lock:
            return self._waiting

    def stop_error(self) -> str | None:
        """Why the run must stop (the outage outlasted its timeout), or None."""
        with self._lock:
            return self._gave_up

    def trip(self, url: str, timeout_s: float) -> None:
        """An undeliverable ``/run``: open the circuit (no-op when already open)."""
        with self._lock:
            if self._opened_at is not None or self._gave_up is not None:
                return
            self._opened_at = time.monotonic()
            self._url, self._timeout_s = url, timeout_s
        logger.warning(
            "NeMo-Gym server %s is unreachable: episodes wait for it (up to NEMO_GYM_OUTAGE_TIMEOUT=%gs)",
            redact_url(url),
            timeout_s,
        )

    def delivered(self) -> None:
        """A ``/run`` reached the server: an outage that gave up is over too."""
        if self._opened_at is None and self._gave_up is None:
            return  # the healthy path: no lock
        self._close(None)

    async def wait(self) -> tuple[bool, float]:
        """Wait while the circuit is open: (server reachable, seconds waited).

        Returns at once when closed. ``False`` means the outage timed out.
        Cancellation (``abort()``, the caller's) propagates as usual.
        """
        if self._opened_at is None and self._gave_up is None:
            return True, 0.0
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        with self._lock:
            self._waiting += 1
        try:
            while True:
                with self._lock:
                    if self._gave_up is not None:
                        return False, time.monotonic() - started
                    if self._opened_at is None:
                        return True, time.monotonic() - started
                    event = self._wakeups.get(loop)
                    if event is None or event.is_set():
                        event = self._wakeups[loop] = asyncio.Event()
                    probe_task = self._probe_task
                    if self._probing and (probe_task is None or probe_task.done() or probe_task.get_loop().is_closed()):
                        self._probing = False  # its loop went away without running its cleanup
                    if not self._probing:
                        self._probing = True
                        # Kept referenced: the loop holds only a weak reference to its tasks.
                        self._probe_task = loop.create_task(self._probe_loop())
                # Woken by the probe; the timeout re-checks that a probe still runs somewhere.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), RECHECK_S)
        finally:
            with self._lock:
                self._waiting -= 1

    async def _probe_loop(self) -> None:
        """The one probe: connect with backoff until the server answers or time runs out."""
        attempt = 0
        last_warning = time.monotonic()
        try:
            while True:
                with self._lock:
                    opened_at, url, timeout_s = self._opened_at, self._url, self._timeout_s
                if opened_at is None:
                    return
                now = time.monotonic()
                if now - opened_at >= timeout_s:
                    self._close(
                        f"the NeMo-Gym server {redact_url(url)} has been unreachable for "
                        f"{now - opened_at:.0f}s (NEMO_GYM_OUTAGE_TIMEOUT={timeout_s:g}s): the run stops. "
                        "Start the server (or fix NEMO_GYM_URL) and resume from the last checkpoint; "
                        "raise NEMO_GYM_OUTAGE_TIMEOUT to wait longer"
                    )
                    return
                if await probe(url, min(10.0, timeout_s)):
                    logger.warning(
                        "NeMo-Gym server %s answers again after %.0fs; sending %d waiting episode(s)",
                        redact_url(url),
                        now - opened_at,
                        self.waiting(),
                    )
                    self._close(None)
                    return
                if time.monotonic() - last_warning >= WARN_EVERY_S:
                    last_warning = time.monotonic()
                    logger.warning(
                        "NeMo-Gym server %s unreachable for %.0fs; %d episode(s) waiting (stop after %gs)",
                        redact_url(url),
                        last_warning - opened_at,
                        self.waiting(),
                        timeout_s,
                    )
                attempt += 1
                delay = random.uniform(0.5, 1.0) * min(PROBE_BACKOFF_MAX_S, PROBE_BACKOFF_S * 2 ** (attempt - 1))
                remaining = opened_at + timeout_s - time.monotonic()
                await asyncio.sleep(max(0.0, min(delay, remaining)))
        finally:
            with self._lock:
                self._probing = False
            # Another loop's waiters may still need a probe (this loop may be closing).
            self._wake_all()

    def _close(self, gave_up: str | None) -> None:
        with self._lock:
            self._opened_at = None
            self._gave_up = gave_up
        if gave_up:
            logger.error("%s", gave_up)
        self._wake_all()

    def _wake_all(self) -> None:
        with self._lock:
            wakeups = list(self._wakeups.items())
            self._wakeups.clear()
        for loop, event in wakeups:
            if loop.is_closed():
                continue
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if loop is running:
                event.set()
            else:
                loop.call_soon_threadsafe(event.set)

    def reset(self) -> None:
        """Closed, with no stop error (tests; a new run in the same process)."""
        self._close(None)


async def probe(url: str, timeout_s: float) -> bool:
    """Whether a TCP connection to ``url``'s host and port opens within ``timeout_s``."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


circuit = Circuit()
"""The process's circuit for the NeMo-Gym server."""
