"""The ledger of finished episodes and group decisions (the process's is ``state.ledger``).

Counted from samples, failures vanish (Miles drops record-less ABORTED samples and dropped
groups), so the two hooks that see them write here: the agent function every finished
episode (with its outage wait, charged to its own role), the group filter every group. The
log functions drain it once per step. It also keeps the run-wide failure streak, which a
drain does not reset; ``streak_stop`` says when that streak stops the run (``filters.check_run``,
docs/episode-pipeline.md). Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field

from miles_nemogym import failure_kinds as fk
from miles_nemogym.episode.record import SWE_ENVIRONMENT, TRAIN
from miles_nemogym.redaction import redact_url
from miles_nemogym.settings import Settings

__all__ = ["EnvironmentTally", "Ledger", "Tally", "streak_stop"]

logger = logging.getLogger(__name__)


@dataclass
class EnvironmentTally:
    """One environment's share of a ``Tally``'s episodes and failures."""

    episodes: int = 0
    failures: Counter[str] = field(default_factory=Counter)


@dataclass
class Tally:
    """What one role (train, or one eval set) did since the last drain."""

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
    environments: dict[str, EnvironmentTally] = field(default_factory=dict)
    """The episodes and failures above, per environment (``swe`` for SWE rows)."""


def _key(role: str, eval_set: str | None) -> str:
    """One tally per eval set: ``train`` or ``eval:<set>``."""
    return TRAIN if role == TRAIN else f"{role}:{eval_set}"


class Ledger:
    """Thread-safe tallies per role, plus the process's failure streak."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[str, Tally] = {}
        self._streak = 0
        self._streak_kinds: Counter[str] = Counter()
        self._streak_envs: Counter[str] = Counter()

    def _tally(self, key: str) -> Tally:
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = Tally()
        return tally

    def record_episode(
        self,
        failure_kind: str | None,
        role: str = TRAIN,
        eval_set: str | None = None,
        outage_wait_s: float = 0.0,
        *,
        environment: str = SWE_ENVIRONMENT,
    ) -> None:
        """One finished episode of ``environment``: ``failure_kind`` None for a valid measurement."""
        with self._lock:
            tally = self._tally(_key(role, eval_set))
            tally.outage_wait_s += outage_wait_s
            if failure_kind == fk.CANCELLED:
                tally.cancelled += 1
                return
            share = tally.environments.setdefault(environment, EnvironmentTally())
            tally.episodes += 1
            share.episodes += 1
            if failure_kind is None:
                self._streak = 0
                self._streak_kinds.clear()
                self._streak_envs.clear()
                return
            tally.failures[failure_kind] += 1
            share.failures[failure_kind] += 1
            self._streak += 1
            self._streak_kinds[failure_kind] += 1
            self._streak_envs[environment] += 1

    def record_group(self, *, kept: bool, salvaged: bool) -> None:
        """One training group decided by the filter: dropped, or kept with failed episodes in it."""
        with self._lock:
            tally = self._tally(TRAIN)
            if not kept:
                tally.groups_dropped += 1
            elif salvaged:
                tally.groups_salvaged += 1

    def streak(self) -> tuple[int, dict[str, int]]:
        """(consecutive failed episodes with no valid one since, their kinds)."""
        with self._lock:
            return self._streak, dict(self._streak_kinds)

    def streak_environments(self) -> dict[str, int]:
        """The environments of the failure streak's episodes."""
        with self._lock:
            return dict(self._streak_envs)

    def drain(self, role: str = TRAIN, eval_set: str | None = None) -> Tally:
        """What ``role`` (and ``eval_set``) did since the last drain; starts a new period."""
        with self._lock:
            return self._tallies.pop(_key(role, eval_set), None) or Tally()

    def reset(self) -> None:
        """Forget everything, the streak included (tests; a new run in the same process)."""
        with self._lock:
            self._tallies.clear()
            self._streak = 0
            self._streak_kinds.clear()
            self._streak_envs.clear()


# -- the failure streak's stop ------------------------------------------------------------------


def streak_stop(settings: Settings, ledger: Ledger) -> str | None:
    """Why the run must stop for ``ledger``'s failure streak (``NEMO_GYM_MAX_FAILURE_STREAK``), or None."""
    limit = settings.max_failure_streak
    if not limit:
        return None
    count, kinds = ledger.streak()
    if count < limit:
        return None
    seen = ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return (
        f"{count} NeMo-Gym episodes in a row failed with no valid one between them "
        f"(NEMO_GYM_MAX_FAILURE_STREAK={limit}): {seen}. The run stops; fix "
        f"{_servers(settings, ledger.streak_environments())} (see the failure kinds in the README) and "
        "resume from the last checkpoint, or set NEMO_GYM_MAX_FAILURE_STREAK=0 to never stop"
    )


def _servers(settings: Settings, environments: dict[str, int]) -> str:
    """The servers a failure streak came from, by the setting that names each."""
    servers = settings.environments
    named = []
    for name, count in sorted(environments.items(), key=lambda kv: -kv[1]):
        server = servers.get(name)
        if server is not None and server.agent is not None:
            named.append(f"the {name} agent server at {redact_url(server.agent)} (NEMO_GYM_ENVS; x{count})")
        elif server is not None:
            named.append(f"the {name} resources server at {redact_url(server.url)} (NEMO_GYM_ENVS; x{count})")
        elif name == SWE_ENVIRONMENT:
            named.append(f"the server at {redact_url(settings.gym_url)} (NEMO_GYM_URL; x{count})")
        else:
            named.append(f"environment {name!r}, which NEMO_GYM_ENVS does not name (x{count})")
    return ", ".join(named) or f"the server at {redact_url(settings.gym_url)}"
