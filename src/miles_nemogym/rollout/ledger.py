"""Process-local ledger of finished episodes and group verdicts, drained by the log functions.

Counted from samples, failures vanish (Miles drops record-less ABORTED samples and dropped
groups), so the agent function and the filter write here. Thread-safe. It also keeps the
run-wide failure streak, which a drain does not reset.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from miles_nemogym import failure_kinds as fk

TRAIN = "train"


@dataclass
class Tally:
    """What one role did since the last drain."""

    episodes: int = 0
    """Finished episodes that are a measurement or a failure (cancelled ones excluded)."""
    failures: Counter[str] = field(default_factory=Counter)
    """Failed episodes by failure kind."""
    cancelled: int = 0
    """Episodes stopped by ``abort()`` (Miles' end-of-step abort of over-sampled episodes)."""
    groups_salvaged: int = 0
    groups_dropped: int = 0
    outage_wait_s: float = 0.0
    """Seconds episodes spent waiting for an unreachable server, summed over episodes."""


class Ledger:
    """Thread-safe tallies per role, plus the process's failure streak."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[str, Tally] = {}
        self._streak = 0
        self._streak_kinds: Counter[str] = Counter()

    def _tally(self, role: str) -> Tally:
        tally = self._tallies.get(role)
        if tally is None:
            tally = self._tallies[role] = Tally()
        return tally

    def record_episode(self, failure_kind: str | None, role: str = TRAIN) -> None:
        """One finished episode: ``failure_kind`` None for a valid measurement."""
        with self._lock:
            tally = self._tally(role)
            if failure_kind == fk.CANCELLED:
                tally.cancelled += 1
                return
            tally.episodes += 1
            if failure_kind is None:
                self._streak = 0
                self._streak_kinds.clear()
                return
            tally.failures[failure_kind] += 1
            self._streak += 1
            self._streak_kinds[failure_kind] += 1

    def record_group(self, *, kept: bool, salvaged: bool, role: str = TRAIN) -> None:
        """One group verdict of the filter: dropped, or kept with failed episodes in it."""
        with self._lock:
            tally = self._tally(role)
            if not kept:
                tally.groups_dropped += 1
            elif salvaged:
                tally.groups_salvaged += 1

    def add_outage_wait(self, seconds: float, role: str = TRAIN) -> None:
        with self._lock:
            self._tally(role).outage_wait_s += seconds

    def streak(self) -> tuple[int, dict[str, int]]:
        """(consecutive failed episodes with no valid one since, their kinds)."""
        with self._lock:
            return self._streak, dict(self._streak_kinds)

    def drain(self, role: str = TRAIN) -> Tally:
        """What ``role`` did since the last drain; starts a new period."""
        with self._lock:
            return self._tallies.pop(role, None) or Tally()

    def reset(self) -> None:
        """Forget everything, the streak included (tests; a new run in the same process)."""
        with self._lock:
            self._tallies.clear()
            self._streak = 0
            self._streak_kinds.clear()


ledger = Ledger()
"""The process's ledger."""
