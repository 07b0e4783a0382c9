"""Waiting for an event a test can observe instead of sleeping a fixed time: on a loaded machine
a fixed sleep can end before the event happened."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["eventually"]


async def eventually(condition: Callable[[], object], what: str, limit_s: float = 30.0) -> None:
    """Return once ``condition()`` is true, polled every 10 ms; fail naming ``what`` after ``limit_s``."""
    loop = asyncio.get_running_loop()
    until = loop.time() + limit_s
    while not condition():
        if loop.time() >= until:
            raise AssertionError(f"not within {limit_s:g}s: {what}")
        await asyncio.sleep(0.01)
