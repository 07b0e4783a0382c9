"""Run an async loopback server (e.g. ``tests.support.fault_server.FaultServer``) from sync tests.

The Miles driver is a separate process, so a Gym stand-in it calls must keep serving
while the test blocks on the step: it gets its own event loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar


class AsyncServer(Protocol):
    async def start(self) -> Any: ...
    async def stop(self) -> None: ...


S = TypeVar("S", bound=AsyncServer)


@contextmanager
def serving_in_thread(server: S) -> Iterator[S]:
    """``server`` started on a background loop for the ``with`` block, then stopped."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=30)
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
