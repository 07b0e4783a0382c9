"""The runtime: what this process keeps across episodes (``Runtime``, which the hooks find with
``current()``; ``install`` replaces it, closing the old one's stores), and ``deliver``, which runs every
episode through it: abortable, its server's outage waited out. Thread-safe; why each rule:
docs/episode-pipeline.md ("Delivering", "Metrics").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from miles_nemogym.episode.record import SWE_ENVIRONMENT, TRAIN, Outcome, failure, failure_of, finish
from miles_nemogym.errors import CANCELLED, TRANSPORT_UNREACHABLE, Failed, counted, redact_url
from miles_nemogym.settings import Settings
from miles_nemogym.store import Stores
from miles_nemogym.transport import Deadline, trust_store

__all__ = ["current"]

logger = logging.getLogger(__name__)


@dataclass
class Tally:
    """What one role (train, or one eval set) did since the last drain."""

    episodes: int = 0  # finished episodes that are a measurement or a failure (cancelled ones excluded)
    failures: Counter[str] = field(default_factory=Counter)  # failed episodes by failure kind
    cancelled: int = 0  # episodes stopped by abort() (Miles' end-of-step abort of over-sampled episodes)
    groups_salvaged: int = 0
    groups_dropped: int = 0
    outage_wait_s: float = 0.0  # seconds episodes waited for an unreachable server, summed
    environments: dict[str, Tally] = field(default_factory=dict)  # episodes and failures per environment


def _key(role: str, eval_set: str | None) -> str:
    """One tally per eval set: ``train`` or ``eval:<set>``."""
    return TRAIN if role == TRAIN else f"{role}:{eval_set}"


class Ledger:
    """Thread-safe tallies per role, plus the process's failure streak."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[str, Tally] = {}
        self._streak_kinds: Counter[str] = Counter()  # the failure streak's episodes by kind
        self._streak_envs: Counter[str] = Counter()  # and by environment

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
            tally = self._tallies.setdefault(_key(role, eval_set), Tally())
            tally.outage_wait_s += outage_wait_s
            if aborted:
                tally.cancelled += 1
                return
            share = tally.environments.setdefault(environment, Tally())
            tally.episodes += 1
            share.episodes += 1
            if failure_kind is None:
                self._streak_kinds.clear()
                self._streak_envs.clear()
                return
            tally.failures[failure_kind] += 1
            share.failures[failure_kind] += 1
            self._streak_kinds[failure_kind] += 1
            self._streak_envs[environment] += 1

    def record_group(self, *, kept: bool, salvaged: bool) -> None:
        """One training group decided by the filter: dropped, or kept with failed episodes in it."""
        with self._lock:
            tally = self._tallies.setdefault(TRAIN, Tally())
            if not kept:
                tally.groups_dropped += 1
            elif salvaged:
                tally.groups_salvaged += 1

    def streak(self) -> tuple[int, dict[str, int], dict[str, int]]:
        """(consecutive failed episodes with no valid one since, their kinds, their environments)."""
        with self._lock:
            return self._streak_kinds.total(), dict(self._streak_kinds), dict(self._streak_envs)

    def drain(self, role: str = TRAIN, eval_set: str | None = None) -> Tally:
        """What ``role`` (and ``eval_set``) did since the last drain (the failure streak stays)."""
        with self._lock:
            return self._tallies.pop(_key(role, eval_set), None) or Tally()


def streak_stop(settings: Settings, ledger: Ledger) -> str | None:
    """Why the run must stop for ``ledger``'s failure streak (``NEMO_GYM_MAX_FAILURE_STREAK``), or None."""
    limit = settings.max_failure_streak
    if not limit:
        return None
    count, kinds, environments = ledger.streak()
    if count < limit:
        return None
    seen = ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return (
        f"{count} NeMo-Gym episodes in a row failed with no valid one between them "
        f"(NEMO_GYM_MAX_FAILURE_STREAK={limit}): {seen}. The run stops; fix "
        f"{_servers(settings, environments)} (see the failure kinds in the README) and "
        "resume from the last checkpoint, or set NEMO_GYM_MAX_FAILURE_STREAK=0 to never stop"
    )


def _servers(settings: Settings, environments: dict[str, int]) -> str:
    """The servers a failure streak came from, by the setting that names each."""
    servers = settings.environments
    named = []
    for name, count in sorted(environments.items(), key=lambda kv: -kv[1]):
        server = servers.get(name)
        if server is not None:
            role, url = ("agent", server.agent) if server.agent is not None else ("resources", server.url)
            named.append(f"the {name} {role} server at {redact_url(url)} (NEMO_GYM_ENVS; x{count})")
        elif name == SWE_ENVIRONMENT:
            named.append(f"the server at {redact_url(settings.gym_url)} (NEMO_GYM_URL; x{count})")
        else:
            named.append(f"environment {name!r}, which NEMO_GYM_ENVS does not name (x{count})")
    return ", ".join(named) or f"the server at {redact_url(settings.gym_url)}"


_MAX_KEYS = 10_000  # distinct keys remembered at most; past it a message is logged every time


class HeldEpisodes:
    """Failed train episodes whose sample may come back without them; at most ``limit``, the oldest go first."""

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


# -- delivering one episode: abortable (``InFlight``), waiting out its server's outage (``Circuit``), sent
# again only when it certainly never arrived; each try under its own NEMO_GYM_RUN_TIMEOUT ------------

AWAITING_RESULT = "awaiting_result"  # an in-flight episode whose request was sent (or was being sent)
NOT_DELIVERED = "not_delivered"  # an in-flight episode whose request has not reached the server


class Episode(Protocol):
    """One prepared episode of any kind, as ``deliver`` runs it: ``server_url`` is the server whose circuit
    holds it, ``setting`` the variable naming it; ``attempt`` is one try: the finished outcome, or ``Failed``
    (``resendable`` when nothing reached the server)."""

    @property
    def server_url(self) -> str: ...

    @property
    def setting(self) -> str: ...

    @property
    def task_id(self) -> str | None: ...

    async def attempt(self, deadline: Deadline) -> Outcome: ...


async def deliver(episode: Episode, settings: Settings, circuits: Circuits, in_flight: InFlight) -> Outcome:
    """Run ``episode`` to its finished ``Outcome``: never raises for a failed episode; cancellation propagates."""
    server = circuits.for_url(episode.server_url, episode.setting)
    try:
        outcome = await in_flight.run(lambda entry: _tries(episode, server, settings, entry))
    except Exception as error:
        outcome = failure_of(error, episode.task_id, settings)
    return finish(outcome, episode.task_id)


async def _tries(episode: Episode, server: Circuit, settings: Settings, entry: _Entry) -> Outcome:
    """Wait while the circuit is open, try once; an undelivered try trips the circuit and waits again."""
    loop = asyncio.get_running_loop()
    last: Failed | None = None
    started: float | None = None
    while True:
        entry.not_delivered = True
        waiting_since = time.monotonic()
        try:
            gave_up_kind, waited = await server.wait()
        except asyncio.CancelledError:  # abort(): its cancelled record still charges the wait
            entry.outage_wait_s += time.monotonic() - waiting_since
            raise
        entry.outage_wait_s += waited
        if gave_up_kind is not None:
            reason = (
                f"the NeMo-Gym server {redact_url(server.url)} could not be reached within NEMO_GYM_OUTAGE_TIMEOUT="
                f"{settings.outage_timeout_s:g}s (this episode waited {entry.outage_wait_s:.0f}s)"
                + (f"; last try: {last}" if last is not None else "")
            )
            outcome = failure_of(Failed(last.kind if last is not None else gave_up_kind, reason), None, settings)
            break
        entry.attempts += 1
        entry.not_delivered = False
        if started is None:
            started = loop.time()
        try:
            # Delivered as its first request leaves, not when its answer comes (a /run's, up to an
            # hour later): the outage it tried in is over for every later try to be timed from.
            sent: asyncio.Future[None] = loop.create_future()
            sent.add_done_callback(lambda _: server.delivered())
            outcome = await episode.attempt(Deadline(settings.run_timeout_s, sent=sent))
        except Failed as failed:
            if failed.resendable:
                last = failed
                server.trip(settings.outage_timeout_s, failed.kind, settings.scrub_text(str(failed)))
                continue
            outcome = failure_of(failed, episode.task_id, settings)
        server.delivered()
        break
    outcome.record.attempts = entry.attempts
    outcome.record.elapsed_s = round(loop.time() - started, 3) if started is not None else 0.0
    outcome.outage_wait_s = entry.outage_wait_s
    return outcome


@dataclass(eq=False)
class _Entry:
    """Where one episode is, for ``abort_all``'s report and a cancelled record."""

    attempts: int = 0  # tries started: 0 means nothing was sent
    not_delivered: bool = True  # nothing of the current try has reached the server
    outage_wait_s: float = 0.0


class InFlight:
    """This process's episodes in flight, on any event loop: what ``abort_all`` stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[_Entry, asyncio.Task[Outcome]] = {}

    async def run(self, tries: Callable[[_Entry], Coroutine[Any, Any, Outcome]]) -> Outcome:
        """``tries(entry)`` in an inner task that ``abort_all`` may cancel: then a ``cancelled`` outcome."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        entry = _Entry()
        task = loop.create_task(tries(entry))
        with self._lock:
            self._tasks[entry] = task
        try:
            try:
                await _ended(task)
            except asyncio.CancelledError:
                # The caller's own cancellation: close the request, then propagate it.
                task.cancel()
                await _ended(task)
                raise
            if not task.cancelled():
                return task.result()
            if entry.not_delivered:
                reason = "stopped by abort() before the request reached the server"
            else:
                reason = "stopped by abort() while waiting for the result; the server-side episode may run on"
            outcome = failure(CANCELLED, reason)
            outcome.aborted = True
            outcome.record.attempts = entry.attempts
            outcome.record.elapsed_s = round(loop.time() - started, 3)
            outcome.outage_wait_s = entry.outage_wait_s
            return outcome
        finally:
            with self._lock:
                del self._tasks[entry]

    def abort_all(self) -> Counter[str]:
        """Cancel every episode in flight; how many were stopped, by state (awaiting result, not delivered)."""
        with self._lock:
            running = list(self._tasks.items())
        states: Counter[str] = Counter()
        for entry, task in running:
            states[NOT_DELIVERED if entry.not_delivered else AWAITING_RESULT] += 1
            _call_on(task.get_loop(), task.cancel)
        return states


def _call_on(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    """``callback`` on ``loop``: at once from the loop's own thread, else thread-safely; never on a closed loop."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is running:
        callback()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(callback)


def _ended(task: asyncio.Task[Outcome]) -> asyncio.Future[None]:
    """A future resolved when ``task`` ends, however it ends; cancelling it leaves ``task``
    running (``asyncio.wait`` for one task, without its per-call set and closure)."""
    ended: asyncio.Future[None] = task.get_loop().create_future()

    def resolve(_: asyncio.Task[Outcome]) -> None:
        if not ended.done():
            ended.set_result(None)

    if task.done():
        ended.set_result(None)
    else:
        task.add_done_callback(resolve)
    return ended


# -- the circuits: waiting out an outage (docs/episode-pipeline.md, "The circuit waits out an outage") --

_WARN_EVERY_S = 60.0
_PROBE_BACKOFF_S = 0.125
_PROBE_BACKOFF_MAX_S = 0.5  # the probe's delay doubles up to this
_RECHECK_S = 10.0


class Circuit:
    """One server's circuit: closed (send), open (wait and probe) or given up (fail, stop the run)."""

    def __init__(self, url: str, setting: str) -> None:
        self.url = url
        self._setting = setting  # the variable that names this server, for the stop message
        self._lock = threading.Lock()
        self._down_since: float | None = None  # the outage clock: first undeliverable request, none delivered since
        self._open = False
        self._timeout_s = 0.0
        self._kind = TRANSPORT_UNREACHABLE
        self._reason = ""
        self._gave_up: str | None = None
        self._probing = False
        self._waiting = 0
        self._wakeups: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}
        self._probe_task: asyncio.Task[None] | None = None

    def waiting(self) -> int:
        with self._lock:
            return self._waiting

    def stop_error(self) -> str | None:
        """Why the run must stop (the outage outlasted its timeout), or None."""
        with self._lock:
            return self._gave_up

    def trip(self, timeout_s: float, kind: str, reason: str) -> None:
        """An undeliverable request: open the circuit (the outage clock runs from the first since delivery)."""
        with self._lock:
            self._kind, self._reason = kind, reason
            if self._open or self._gave_up is not None:
                return
            self._open = True
            self._timeout_s = timeout_s
            fresh = self._down_since is None
            if fresh:
                self._down_since = time.monotonic()
        if fresh:
            logger.warning(
                "NeMo-Gym server %s cannot be reached (%s): its episodes wait (up to NEMO_GYM_OUTAGE_TIMEOUT=%gs)",
                redact_url(self.url),
                reason,
                timeout_s,
            )

    def delivered(self) -> None:
        """A request reached the server: the outage (also one that gave up) is over."""
        if self._down_since is None and self._gave_up is None:
            return  # the healthy path: no lock
        with self._lock:
            self._down_since = None
        self._close(None)

    async def wait(self) -> tuple[str | None, float]:
        """Wait while the circuit is open: (the kind if the outage timed out, else None; seconds waited)."""
        if not self._open and self._gave_up is None:
            return None, 0.0
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        with self._lock:
            self._waiting += 1
        try:
            while True:
                with self._lock:
                    if self._gave_up is not None:
                        return self._kind, time.monotonic() - started
                    if not self._open:
                        return None, time.monotonic() - started
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
                # Woken by the probe; the timer re-checks that a probe still runs. Not ``wait_for``: before
                # Python 3.12 it swallows a cancellation (abort()) landing as the event is set: a resend.
                recheck = loop.call_later(_RECHECK_S, event.set)
                try:
                    await event.wait()
                finally:
                    recheck.cancel()
        finally:
            with self._lock:
                self._waiting -= 1

    async def _probe_loop(self) -> None:
        """The one probe: connect with capped backoff until the server answers or time runs out."""
        attempt = 0
        last_warning = time.monotonic()
        try:
            while True:
                url = self.url
                with self._lock:
                    down_since, timeout_s = self._down_since, self._timeout_s
                    is_open, kind, reason = self._open, self._kind, self._reason
                if not is_open or down_since is None:
                    return
                now = time.monotonic()
                if now - down_since >= timeout_s:
                    self._close(
                        f"the NeMo-Gym server {redact_url(url)} could not be reached for "
                        f"{now - down_since:.0f}s ({kind}: {reason}; NEMO_GYM_OUTAGE_TIMEOUT={timeout_s:g}s): "
                        f"the run stops. Start the server (or fix {self._setting}, or its TLS certificate) and "
                        "resume from the last checkpoint; raise NEMO_GYM_OUTAGE_TIMEOUT to wait longer"
                    )
                    return
                # Wait first: right after a failed /run (or a probe that let one fail again), a
                # connection at once would only spin. Capped backoff, jittered down to half.
                delay = random.uniform(0.5, 1.0) * min(_PROBE_BACKOFF_MAX_S, _PROBE_BACKOFF_S * 2.0**attempt)
                await asyncio.sleep(max(0.0, min(delay, down_since + timeout_s - time.monotonic())))
                attempt += 1
                error = await _connect(url, min(10.0, timeout_s))
                if error is None:
                    logger.info(
                        "NeMo-Gym server %s answers a connection after %.0fs; sending %s",
                        redact_url(url),
                        time.monotonic() - down_since,
                        counted(self.waiting(), "waiting episode"),
                    )
                    self._close(None)
                    return
                with self._lock:
                    self._reason = error
                if time.monotonic() - last_warning >= _WARN_EVERY_S:
                    last_warning = time.monotonic()
                    logger.warning(
                        "NeMo-Gym server %s unreachable for %.0fs (%s); %s waiting (stop after %gs)",
                        redact_url(url),
                        last_warning - down_since,
                        error,
                        counted(self.waiting(), "episode"),
                        timeout_s,
                    )
        finally:
            with self._lock:
                self._probing = False
            # Another loop's waiters may still need a probe (this loop may be closing).
            self._wake_all()

    def _close(self, gave_up: str | None) -> None:
        with self._lock:
            self._open = False
            self._gave_up = gave_up
        if gave_up:
            logger.error("%s", gave_up)
        self._wake_all()

    def _wake_all(self) -> None:
        with self._lock:
            wakeups = list(self._wakeups.items())
            self._wakeups.clear()
        for loop, event in wakeups:
            _call_on(loop, event.set)


async def _connect(url: str, timeout_s: float) -> str | None:
    """Open (and close) a connection to ``url``'s host as a request would (TCP, TLS for ``https``),
    never sending one (``/run`` would start a paid episode); None on success, else what failed."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=trust_store() if tls else None), timeout_s
        )
    except ssl.SSLError as error:
        return f"TLS: {error}"
    except (OSError, asyncio.TimeoutError) as error:
        return f"cannot connect: {error or type(error).__name__}"
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
    return None


class Circuits:
    """The process's circuits, one per server URL, created on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_url: dict[str, Circuit] = {}

    def for_url(self, url: str, setting: str) -> Circuit:
        """The circuit of the server at ``url`` (``setting`` names the variable that set it)."""
        with self._lock:
            found = self._by_url.get(url)
            if found is None:
                found = self._by_url[url] = Circuit(url, setting)
            return found

    def all(self) -> list[Circuit]:
        with self._lock:
            return list(self._by_url.values())

    def stop_error(self) -> str | None:
        """Why the run must stop (a server's outage outlasted its timeout), or None."""
        return next((error for error in map(Circuit.stop_error, self.all()) if error is not None), None)


class Runtime:
    """Everything the hooks keep across episodes; tests build ``Runtime(Settings(...))``."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._settings = settings  # the NEMO_GYM_* variables, read on first use (again only while invalid)
        self.ledger = Ledger()  # every finished episode and group decision, the failure streak
        self.circuits = Circuits()  # one per server: outage waits and the outage stop
        self.in_flight = InFlight()  # the episodes abort() (and a run stop) cancel
        self.held = HeldEpisodes()  # failed episodes waiting for their ABORTED sample
        self.stores = Stores()  # the episode stores open in this process
        self.reward_problems: Counter[str] = Counter()  # samples the reward hook scored 0.0, by reason
        self.logged = LoggedOnce()  # the messages logged once
        self.addresses: dict[tuple[str, int], str] = {}  # the local address that routes to each Gym host

    @property
    def settings(self) -> Settings:
        """The settings given, else the environment's (read again while invalid: ``SettingsError``)."""
        if self._settings is None:
            self._settings = Settings.from_env()
        return self._settings

    def close(self) -> None:
        self.stores.close()


_process: list[Runtime] = []  # this process's runtime, once made: the one module-level holder


def current() -> Runtime:
    if not _process:
        _process.append(Runtime())
    return _process[0]


def install(runtime: Runtime | None = None) -> Runtime:
    """Make ``runtime`` (default: a fresh one) this process's, closing the one it replaces; returns it."""
    for old in _process:
        old.close()
    _process[:] = [runtime or Runtime()]
    return _process[0]
