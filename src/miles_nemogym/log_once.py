"""Log a message once per process: configuration errors and warnings that would repeat on
every episode. ``reset`` forgets what was logged (tests; a new run in the same process)."""

from __future__ import annotations

import logging
import threading

__all__ = ["log_once", "reset"]

_MAX_KEYS = 10_000
"""Distinct keys remembered at most; past it a message is logged every time (never lost)."""

_lock = threading.Lock()
_seen: set[str] = set()


def log_once(logger: logging.Logger, level: int, key: str, message: str, *args: object) -> bool:
    """Log ``message % args`` at ``level`` the first time ``key`` is seen; whether it was logged."""
    with _lock:
        if key in _seen:
            return False
        if len(_seen) < _MAX_KEYS:
            _seen.add(key)
    logger.log(level, message + " [logged once]", *args)
    return True


def reset() -> None:
    """Forget every key, so each message is logged again once."""
    with _lock:
        _seen.clear()
