"""Delivery on its own: ``runtime.deliver`` with a scripted ``Episode`` (no ``/run``, no
environment loop), its own ``Circuits`` and ``InFlight``, and real loopback ports for the probe."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from miles_nemogym.episode.record import EpisodeRecord, Outcome
from miles_nemogym.errors import CANCELLED, CLIENT_ERROR, INVALID_CONFIG, TRANSPORT_UNREACHABLE, Failed, SettingsError
from miles_nemogym.runtime import AWAITING_RESULT, NOT_DELIVERED, Circuits, InFlight, current, deliver, install
from miles_nemogym.settings import Settings
from miles_nemogym.transport import Deadline
from tests.support.circuits import is_open, reset, waiting_episodes
from tests.support.eventually import eventually
from tests.support.fake_resources import fake_resources
from tests.support.ports import free_port

Try = Callable[[Deadline], Awaitable[Outcome]]
REFUSED = Failed(TRANSPORT_UNREACHABLE, "connection refused", resendable=True)


def graded(reward: float = 1.0) -> Outcome:
    return Outcome(reward=reward, record=EpisodeRecord(status="ok", server_reward=reward))


@dataclass
class ScriptedEpisode:
    """An ``Episode`` whose tries are scripted: an ``Outcome``, an exception to raise (``Failed``,
    resendable when nothing was delivered), or a coroutine function of the deadline."""

    server_url: str
    script: list[Outcome | Exception | Try]
    setting: str = "NEMO_GYM_URL"
    task_id: str | None = "task-1"
    deadlines: list[float] = field(default_factory=list)
    """The time each try had left when it started."""

    async def attempt(self, deadline: Deadline) -> Outcome:
        self.deadlines.append(deadline.remaining())
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        if callable(step):
            return await step(deadline)
        return step


class Held:
    """A try that reached the server and waits for its answer until cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def __call__(self, deadline: Deadline) -> Outcome:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("not reached")


def settings_with(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    install()
    return current().settings


async def test_a_delivered_episode_is_finished_with_its_own_id_and_one_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_with(monkeypatch, NEMO_GYM_RUN_TIMEOUT="120")
    episode = ScriptedEpisode("http://127.0.0.1:1", [graded(0.5)])
    circuits = Circuits()
    first = await deliver(episode, settings, circuits, InFlight())
    second = await deliver(ScriptedEpisode("http://127.0.0.1:1", [graded()]), settings, circuits, InFlight())
    assert (first.reward, first.record.attempts, first.record.instance_id) == (0.5, 1, "task-1")
    assert first.record.episode_id and first.record.episode_id != second.record.episode_id
    assert first.outage_wait_s == 0.0 and first.record.elapsed_s >= 0.0
    assert 110 < episode.deadlines[0] <= 120  # the try gets the whole NEMO_GYM_RUN_TIMEOUT
    assert not is_open(circuits) and circuits.stop_error() is None


async def test_an_undelivered_try_waits_for_the_server_then_is_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_with(monkeypatch, NEMO_GYM_OUTAGE_TIMEOUT="30")
    circuits = Circuits()
    async with fake_resources() as listening:  # the probe only connects: nothing is requested
        episode = ScriptedEpisode(listening.url, [REFUSED, graded()])
        out = await deliver(episode, settings, circuits, InFlight())
        assert listening.received == []
    assert (out.record.status, out.record.attempts) == ("ok", 2)
    assert out.outage_wait_s > 0  # charged to the episode's tally
    assert not is_open(circuits.for_url(listening.url, "NEMO_GYM_URL")) and circuits.stop_error() is None


async def test_an_outage_past_its_timeout_fails_the_episode_and_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_with(monkeypatch, NEMO_GYM_OUTAGE_TIMEOUT="0.5")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    circuits = Circuits()
    episode = ScriptedEpisode(url, [REFUSED], setting="NEMO_GYM_ENVS")
    out = await asyncio.wait_for(deliver(episode, settings, circuits, InFlight()), 30)
    assert (out.record.failure_kind, out.record.attempts, out.record.mask_sample) == (TRANSPORT_UNREACHABLE, 1, True)
    assert "NEMO_GYM_OUTAGE_TIMEOUT=0.5s" in (out.record.failure_reason or "")
    assert "last try: connection refused" in (out.record.failure_reason or "")
    stop = circuits.stop_error()
    assert stop is not None and "fix NEMO_GYM_ENVS" in stop and "the run stops" in stop
    # The next episode for that server fails at once, sending nothing.
    later = ScriptedEpisode(url, [graded()])
    again = await asyncio.wait_for(deliver(later, settings, circuits, InFlight()), 5)
    assert (again.record.failure_kind, again.record.attempts, later.script) == (TRANSPORT_UNREACHABLE, 0, [graded()])


def test_one_circuit_per_server_url() -> None:
    circuits = Circuits()
    down = circuits.for_url("http://a:1", "NEMO_GYM_ENVS")
    assert circuits.for_url("http://a:1", "NEMO_GYM_ENVS") is down
    other = circuits.for_url("http://b:1", "NEMO_GYM_ENVS")
    down.trip(60, TRANSPORT_UNREACHABLE, "refused")
    assert is_open(down) and not is_open(other) and is_open(circuits)
    down.delivered()
    assert not is_open(down) and not is_open(circuits)
    down.trip(60, TRANSPORT_UNREACHABLE, "refused")
    reset(circuits)
    assert not is_open(circuits) and circuits.for_url("http://a:1", "NEMO_GYM_ENVS") is not down


@pytest.mark.parametrize(
    ("error", "kind"),
    [(SettingsError("NEMO_GYM_X is bad"), INVALID_CONFIG), (KeyError("defect"), CLIENT_ERROR)],
)
async def test_an_error_on_our_side_is_a_failed_outcome_not_an_exception(
    error: Exception, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = await deliver(
        ScriptedEpisode("http://127.0.0.1:1", [error]), settings_with(monkeypatch), Circuits(), InFlight()
    )
    assert (out.record.failure_kind, out.record.mask_sample, out.record.instance_id) == (kind, True, "task-1")
    assert out.record.episode_id


async def test_abort_all_stops_an_episode_awaiting_its_result(monkeypatch: pytest.MonkeyPatch) -> None:
    held, in_flight = Held(), InFlight()
    task = asyncio.create_task(
        deliver(ScriptedEpisode("http://127.0.0.1:1", [held]), settings_with(monkeypatch), Circuits(), in_flight)
    )
    await asyncio.wait_for(held.started.wait(), 10)
    assert in_flight.abort_all() == Counter({AWAITING_RESULT: 1})
    out = await asyncio.wait_for(task, 10)
    assert (out.record.failure_kind, out.record.attempts, held.cancelled) == (CANCELLED, 1, True)
    assert "the server-side episode may run on" in (out.record.failure_reason or "")
    assert in_flight.abort_all() == Counter()  # nothing left in flight


async def test_abort_all_from_another_thread_stops_an_episode_waiting_out_an_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = settings_with(monkeypatch, NEMO_GYM_OUTAGE_TIMEOUT="60")
    circuits, in_flight = Circuits(), InFlight()
    url = f"http://127.0.0.1:{free_port()}"
    task = asyncio.create_task(deliver(ScriptedEpisode(url, [REFUSED, graded()]), settings, circuits, in_flight))
    await eventually(lambda: waiting_episodes(circuits), "the episode waits out the outage")
    assert await asyncio.to_thread(in_flight.abort_all) == Counter({NOT_DELIVERED: 1})
    out = await asyncio.wait_for(task, 10)
    assert (out.record.failure_kind, out.record.attempts) == (CANCELLED, 1)
    assert "before the request reached the server" in (out.record.failure_reason or "")
    assert waiting_episodes(circuits) == 0 and out.outage_wait_s > 0  # the wait it was cut short in is charged


async def test_the_callers_cancellation_propagates_and_cancels_the_try(monkeypatch: pytest.MonkeyPatch) -> None:
    held, in_flight = Held(), InFlight()
    task = asyncio.create_task(
        deliver(ScriptedEpisode("http://127.0.0.1:1", [held]), settings_with(monkeypatch), Circuits(), in_flight)
    )
    await asyncio.wait_for(held.started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert held.cancelled and in_flight.abort_all() == Counter()
