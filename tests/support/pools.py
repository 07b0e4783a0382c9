"""What tests read of the transport's per-loop pools."""

from __future__ import annotations

import asyncio

from miles_nemogym import transport


def open_pools() -> int:
    """How many open pools this event loop holds (one per ``NEMO_GYM_MAX_CONCURRENCY`` used)."""
    pools = transport._pools.get(asyncio.get_running_loop())
    return 0 if pools is None else sum(not one.gym.closed for one in pools.by_limit.values())
