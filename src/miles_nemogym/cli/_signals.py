"""SIGTERM (a job scheduler, ``kill``) unwinds a command like Ctrl-C, so its cleanup runs."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["interrupt_on_sigterm"]


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def interrupt_on_sigterm(*, ctrl_c: bool = False) -> Iterator[None]:
    """Inside, SIGTERM raises ``KeyboardInterrupt``; ``ctrl_c`` also re-enables Ctrl-C (a shell
    starts background jobs with SIGINT ignored). Off the main thread, signals stay as they are."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread
        yield
        return
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler) if ctrl_c else None
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
