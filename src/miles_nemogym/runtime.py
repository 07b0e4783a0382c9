"""The runtime: what this process keeps across episodes, in one object.

Miles calls each hook with no object of ours, so the hooks find the process's ``Runtime`` with
``current()``, made on first use and handed down from there:

    settings         settings.Settings           the NEMO_GYM_* variables, read once on first use
                                                 and frozen (read again only while invalid)
    ledger           Ledger (below)              every finished episode and group decision, the
                                                 failure streak (agent.run, the filter, the log functions)
    circuits         episode/delivery.Circuits   one per server: outage waits and the outage stop
    in_flight        episode/delivery.InFlight   the episodes ``agent.abort`` (and a run stop) cancel
    held             HeldEpisodes (below)        failed episodes waiting for their ABORTED sample
    stores           store.Stores                the episode stores open in this process
    reward_problems  Counter                     samples the reward hook scored 0.0, by reason
    logged           LoggedOnce (below)          the messages logged once
    addresses        dict                        the local address that routes to each Gym host

``install`` replaces it with a fresh one, or one a caller built (tests build
``Runtime(Settings(...))``; a new run in the same process), closing the old one's stores.
The connection pools are per event loop and close with it (``transport``).

The ledger is the runtime's own record. Counted from samples, failures vanish (Miles drops
record-less ABORTED samples and dropped groups), so the two hooks that see them write here:
the agent function every finished episode (with its outage wait, charged to its own role),
the group filter every group. The log functions drain it once per step. It also keeps the
run-wide failure streak, which a drain does not reset; ``streak_stop`` says when that streak
stops the run (``groups.check_run``, docs/episode-pipeline.md). Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from miles_nemogym.episode.delivery import Circuits, InFlight
from miles_nemogym.episode.record import SWE_ENVIRONMENT, TRAIN
from miles_nemogym.errors import redact_url
from miles_nemogym.settings import Settings
from miles_nemogym.store import Stores

__all__ = ["Runtime", "current", "install"]

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
        aborted: bool = False,
    ) -> None:
        """One finished episode of ``environment``: ``failure_kind`` None for a valid measurement;
        ``aborted``: stopped by our abort, counted apart (a server's own ``cancelled`` is a failure)."""
        with self._lock:
            tally = self._tally(_key(role, eval_set))
            tally.outage_wait_s += outage_wait_s
            if aborted:
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


_MAX_KEYS = 10_000
"""Distinct keys remembered at most; past it a message is logged every time (never lost)."""


class HeldEpisodes:
    """Failed train episodes of the current step whose sample may come back without them,
    oldest first; at most ``limit`` (the oldest go first: their groups have long been seen).
    The agent function holds them, the group filter gives them back (``groups``)."""

    def __init__(self, limit: int = 4096) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._episodes: dict[tuple[str, str], dict[str, Any]] = {}

    def hold(self, task: str, episode_id: str, result: dict[str, Any]) -> None:
        with self._lock:
            self._episodes[(task, episode_id)] = result
            if len(self._episodes) > self._limit:
                del self._episodes[next(iter(self._episodes))]

    def release(self, task: str, episode_id: str) -> None:
        with self._lock:
            self._episodes.pop((task, episode_id), None)

    def claim(self, task: str) -> dict[str, Any] | None:
        """The oldest held episode of ``task``, taken out."""
        with self._lock:
            key = next((key for key in self._episodes if key[0] == task), None)
            return None if key is None else self._episodes.pop(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._episodes)

    def clear(self) -> int:
        with self._lock:
            count = len(self._episodes)
            self._episodes.clear()
            return count


class LoggedOnce:
    """The keys of the messages logged so far (thread-safe): the runtime's ``logged``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[str] = set()

    def log(self, logger: logging.Logger, level: int, key: str, message: str, *args: object) -> bool:
        """Log ``message % args`` at ``level`` the first time ``key`` is seen; whether it was logged."""
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) < _MAX_KEYS:
                self._seen.add(key)
        logger.log(level, message + " [logged once]", *args)
        return True


class Runtime:
    """Everything the hooks keep across episodes (see the module docstring)."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._settings = settings
        self.ledger = Ledger()
        self.circuits = Circuits()
        self.in_flight = InFlight()
        self.held = HeldEpisodes()
        self.stores = Stores()
        self.reward_problems: Counter[str] = Counter()
        self.logged = LoggedOnce()
        self.addresses: dict[tuple[str, int], str] = {}

    @property
    def settings(self) -> Settings:
        """The settings given, else the environment's, read on first use; raises ``SettingsError``
        (and reads again next time) while they are invalid."""
        if self._settings is None:
            self._settings = Settings.from_env()
        return self._settings

    def close(self) -> None:
        """Close every store (what was queued is written)."""
        self.stores.close()


_process: list[Runtime] = []
"""This process's runtime, once made: the one module-level holder."""


def current() -> Runtime:
    """This process's runtime, made on first use."""
    if not _process:
        _process.append(Runtime())
    return _process[0]


def install(runtime: Runtime | None = None) -> Runtime:
    """Make ``runtime`` (default: a fresh one, reading the environment on first use) this
    process's, closing the one it replaces; returns it."""
    for old in _process:
        old.close()
    _process[:] = [runtime or Runtime()]
    return _process[0]
