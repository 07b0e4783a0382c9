"""The recording policy with answers a test can slow down or hold: for tests of an abort, a
cancellation or a server lost while an episode waits on its policy. ``RecordingPolicy`` (src)
answers at once, as the smoke run needs; holding answers is the tests' own business."""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Any

from aiohttp import web

from miles_nemogym.smoke._policy import RecordingPolicy

__all__ = ["HeldPolicy"]


class HeldPolicy(RecordingPolicy):
    """``hold_all``, or ``hold_session(id)`` for one session: answers wait until ``release()``
    (or stop). ``arrivals(id)`` counts the chat requests that arrived, held or not
    (``requests`` records a request as it is answered)."""

    def __init__(self, *, hold_all: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.hold_all = hold_all
        self._held: set[str] = set()
        self._arrived: list[str] = []
        self._arrived_lock = threading.Lock()
        self._released: asyncio.Event | None = None
        self._held_loop: asyncio.AbstractEventLoop | None = None

    def hold_session(self, session_id: str) -> None:
        """Hold ``session_id``'s answers until ``release()``."""
        self._held.add(session_id)

    def release(self) -> None:
        """Let every held answer through, now and from now on (callable from any thread)."""
        if self._held_loop is not None and self._released is not None:
            self._held_loop.call_soon_threadsafe(self._released.set)

    def arrivals(self, session_id: str | None = None) -> int:
        """Chat requests that arrived (all, or one session's), answered or still held."""
        with self._arrived_lock:
            return sum(session_id is None or sid == session_id for sid in self._arrived)

    async def _chat(self, request: web.Request) -> web.Response:
        sid = request.match_info.get("session_id") or ""
        with self._arrived_lock:
            self._arrived.append(sid)
        if (self.hold_all or sid in self._held) and self._released is not None:
            await self._released.wait()
        return await super()._chat(request)

    async def start(self) -> HeldPolicy:
        self._held_loop = asyncio.get_running_loop()
        self._released = asyncio.Event()
        await super().start()
        return self

    async def stop(self) -> None:
        if self._released is not None:
            self._released.set()  # held answers complete instead of hanging the shutdown
        await super().stop()

    async def __aenter__(self) -> HeldPolicy:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def __enter__(self) -> HeldPolicy:
        super().__enter__()
        return self
