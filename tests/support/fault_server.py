"""The loopback stand-in for a NeMo-Gym ``mini_swe_agent_2`` server's ``POST /run``, with faults.

It answers as nemo-gym 0.7.0's ``MiniSWEAgent.run`` (``responses_api_agents/mini_swe_agent_2/app.py``)
does: a ``MiniSWEAgentVerifyResponse`` (``responses_create_params``, ``response``, ``reward``,
``mask_sample``, ``failure_kind``, ``failure_reason``, ``instance_id``, ``metadata``) built from the
real results shipped in the nemo-gym wheel, graded for the instance sent (``result_for``); an
episode that raised as reward 0.0 with no input or output and ``metadata`` ``{error, traceback}``
(``crashed_result``); an exception outside that ``try`` as a plain HTTP 500; a body FastAPI refuses
as a 422 ``{"detail": [...]}``. It serves ``/openapi.json`` as the FastAPI app does, and records
every request it receives so tests can assert how many episodes were started.

Start it on the test's event loop (``start``/``stop``) or, for a CLI run in-process or a
subprocess, on its own thread (``tests.support.threaded.serving_in_thread``). Registered as a
pytest plugin in ``tests/conftest.py``: every test module gets ``gym_in_thread``, one serving the
wheel's five results from a thread.
"""

from __future__ import annotations

import asyncio
import copy
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from tests.support.mini_swe_agent import call_policy
from tests.support.openapi import openapi_document
from tests.support.ports import free_port
from tests.support.threaded import serving_in_thread

EARLY_ERRORS = frozenset({"500", "422", "echo_key_422", "nonjson"})
"""Modes answered before any episode work (no policy call)."""
_ANSWER_DEFAULTS: dict[str, Any] = {"mask_sample": False, "failure_kind": None, "failure_reason": None}
"""``BaseVerifyResponse``'s fields that ``mini_swe_agent_2`` never sets: its answer carries their defaults."""

Mode = str | float
"""How one ``/run`` is answered: ok | hold | 500 | 422 | echo_key_422 | nonjson | error_metadata |
echo_key_error, or a number: ``ok`` with that reward."""


def result_for(result: dict[str, Any], instance: str) -> dict[str, Any]:
    """The /run answer for ``instance`` from a real /run ``result``, as the server grades the
    instance it was sent: ``instance_id`` as sent, the SWE-bench report keyed by it in lower case
    (nemo-gym lowercases the ids it reports), without the rollout collector's own keys
    (``agent_ref``, ``_ng_*``: the wheel's results carry them, no /run answer does)."""
    answer = {k: copy.deepcopy(v) for k, v in result.items() if k != "agent_ref" and not k.startswith("_ng_")}
    metadata = answer.get("metadata")
    if isinstance(metadata, dict):
        reported = instance.lower()
        reports = metadata.get("eval_report")
        if isinstance(reports, dict) and reports and reported not in reports:
            metadata["eval_report"] = {reported: next(iter(reports.values()))}
        metadata["instance_id"] = reported
    return {**_ANSWER_DEFAULTS, **answer, "instance_id": instance}


def crashed_result(result: dict[str, Any], instance: str, error: str, traceback: str) -> dict[str, Any]:
    """The /run answer for ``instance`` when its episode raised: what ``MiniSWEAgent.run``'s
    ``except`` sends (reward 0.0, no input messages, no output, ``metadata`` the error)."""
    answer = result_for(result, instance)
    for name, emptied in (("responses_create_params", "input"), ("response", "output")):
        if isinstance(answer.get(name), dict):
            answer[name][emptied] = []
    return {**answer, "reward": 0.0, "metadata": {"error": error, "traceback": traceback}}


@dataclass
class FaultServer:
    """``mode`` for every instance, ``modes`` per instance id (see ``Mode``): ``hold`` answers ``ok``
    once ``release`` is set, ``hold_s`` delays any answer; either ends early when the client hangs up.

    ``respond``, when set, builds the answer from the request body instead (any shape,
    headers or encoding a test needs)."""

    result: dict[str, Any]
    mode: str = "ok"
    modes: dict[str, str] = field(default_factory=dict)
    """Per instance id, the mode that replaces ``mode`` for it."""
    respond: Callable[[dict[str, Any]], web.Response] | None = None
    hold_s: float = 0.0
    hold_s_for: Callable[[dict[str, Any]], float] | None = None
    """When set, each ``/run``'s hold in seconds (replaces ``hold_s``): long-tailed episode times."""
    port: int = field(default_factory=free_port)
    openapi: dict[str, Any] = field(default_factory=openapi_document)
    """What ``GET /openapi.json`` answers (the agent server's schema, listing ``POST /run``)."""
    results_by_instance: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Answer an instance with its own real result (else ``result``), as the real server would."""
    error_note: str = ""
    """Starts the 422 modes' error message: the agent logs each distinct configuration error
    once per process, so a test that counts log lines gives its own note."""
    policy_calls: int = 0
    between_calls_s: float = 0.0
    """Seconds between an episode's policy calls (the tool time of a turn)."""
    """Chat completions to make on the request's ``policy_base_url`` before answering, as an
    episode does: Miles' session server only turns a session with model calls into a sample."""
    first_wave: int = 0
    """When set, no ``/run`` is answered before this many have arrived and made their policy calls
    (an early error waits too): a first wave of episodes that all called the policy before any of
    them ended, whatever the load. Later ``/run`` requests are not held."""
    graded_after: int = 0
    """When set, no graded answer (a reward) before this many ``/run`` requests have arrived; error
    answers are not held. Miles submits a new group only after putting a finished one, so the
    ``/run`` past the groups in flight proves a group of errors was judged before any graded
    episode ended, whatever the load."""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) on ``time.monotonic`` of every ``/run`` answered: how busy the server was."""
    in_flight: int = 0
    peak_in_flight: int = 0
    peers: set[tuple[str, int]] = field(default_factory=set)
    disconnected: list[str] = field(default_factory=list)
    """The instance of every held request whose client hung up before the answer."""
    release: threading.Event = field(default_factory=threading.Event)
    """Set (from any thread) to answer the ``hold`` requests; ``stop`` sets it."""
    _held: list[str] = field(default_factory=list)
    _first_wave_in: asyncio.Event | None = None
    _graded_in: asyncio.Event | None = None
    _called: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _runner: web.AppRunner | None = None

    @classmethod
    def with_fault(cls, results: dict[str, dict[str, Any]], instance_id: str, mode: str) -> FaultServer:
        """Each instance gets its own real result from ``results`` (by id), except ``instance_id``,
        which gets ``mode``; each episode first makes one policy call, as a real one does."""
        return cls(result=results[instance_id], results_by_instance=results, modes={instance_id: mode}, policy_calls=1)

    @classmethod
    def of_results(cls, results: list[dict[str, Any]], **options: Any) -> FaultServer:
        """Each instance answered with its own result from ``results`` (copies: a test may edit them)."""
        by_id = {result["instance_id"]: copy.deepcopy(result) for result in results}
        return cls(result=next(iter(by_id.values())), results_by_instance=by_id, **options)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def disconnects(self) -> int:
        return len(self.disconnected)

    def received_ids(self) -> list[str]:
        """The ``instance_id`` of every ``/run`` received, in order."""
        with self._lock:
            return [str(body.get("instance_id")) for body in self.bodies]

    def held_now(self) -> set[str]:
        """The instances whose ``/run`` is being held right now."""
        with self._lock:
            return set(self._held)

    def mode_for(self, body: dict[str, Any]) -> Mode:
        """How this ``/run`` is answered (called once per request, after it is recorded)."""
        return self.modes.get(str(body.get("instance_id")), self.mode)

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(self.openapi)

    async def _hold(self, request: web.Request, instance: str, mode: Mode, hold_s: float) -> bool:
        """Wait ``hold_s``, and in mode ``hold`` until ``release``; False when the client hung up meanwhile."""
        loop = asyncio.get_running_loop()
        until = loop.time() + hold_s
        with self._lock:
            self._held.append(instance)
        try:
            while loop.time() < until or (mode == "hold" and not self.release.is_set()):
                await asyncio.sleep(0.02)
                if request.transport is None or request.transport.is_closing():
                    with self._lock:
                        self.disconnected.append(instance)
                    return False
        finally:
            with self._lock:
                self._held.remove(instance)
        return True

    async def _await_first_wave(self) -> None:
        """Count this ``/run`` as having made its policy calls; wait until ``first_wave`` have."""
        if self._first_wave_in is None:
            return
        self._called += 1
        if self._called >= self.first_wave:
            self._first_wave_in.set()  # wakes every waiter at once, before any later request is read
        await self._first_wave_in.wait()

    async def _run(self, request: web.Request) -> web.Response:
        body = await request.json()
        started = time.monotonic()
        with self._lock:
            self.bodies.append(body)
        if self._graded_in is not None and len(self.bodies) >= self.graded_after:
            self._graded_in.set()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer:
            self.peers.add(tuple(peer[:2]))
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        instance = str(body.get("instance_id"))
        mode = self.mode_for(body)
        try:
            # An error answer comes before any episode work: no model call.
            for turn in range(0 if mode in EARLY_ERRORS else self.policy_calls):
                if turn and self.between_calls_s:
                    await asyncio.sleep(self.between_calls_s)
                await call_policy(body, turn)
            await self._await_first_wave()
            if self._graded_in is not None and isinstance(mode, float | int):
                await self._graded_in.wait()
            hold_s = self.hold_s if self.hold_s_for is None else self.hold_s_for(body)
            if (hold_s > 0 or mode == "hold") and not await self._hold(request, instance, mode, hold_s):
                return web.Response(status=499)
        finally:
            self.in_flight -= 1
            with self._lock:
                self.spans.append((started, time.monotonic()))
        if self.respond is not None:
            return self.respond(body)
        return self._answer(mode, body, self.results_by_instance.get(instance, self.result))

    def _answer(self, mode: Mode, body: dict[str, Any], result: dict[str, Any]) -> web.Response:
        instance = str(body.get("instance_id"))
        if isinstance(mode, float | int):
            return web.json_response({**result_for(result, instance), "reward": float(mode)})
        if mode == "500":
            return web.Response(status=500, text="Internal Server Error")
        if mode == "422":
            where = ["body", "responses_create_params", "top_k"]
            msg = f"{self.error_note}Extra inputs are not permitted"
            return web.json_response({"detail": [{"loc": where, "msg": msg}]}, status=422)
        if mode == "echo_key_422":
            # FastAPI echoes the offending input; placed so that the 300-char reason cut splits the key.
            echoed: dict[str, Any] = {"policy_api_key": body.get("policy_api_key", "")}
            detail = [{"msg": self.error_note.ljust(238, "x"), "input": echoed}]
            return web.json_response({"detail": detail}, status=422)
        if mode == "nonjson":  # a proxy in front of the server answered
            return web.Response(status=200, text="<html>proxy error</html>", content_type="text/html")
        if mode == "error_metadata":  # as when building the eval script fails offline
            error, traceback = "Failed to build eval script: no network", "Traceback (most recent call last):\n..."
            return web.json_response(crashed_result(result, instance, error, traceback))
        if mode == "echo_key_error":  # an error quoting the policy's API key
            key = body.get("policy_api_key", "")
            return web.json_response(crashed_result(result, instance, f"auth failed for {key}", key))
        if mode not in ("ok", "hold"):  # a misspelt mode must not pass as a graded answer
            raise ValueError(f"FaultServer has no mode {mode!r}; see Mode")
        return web.json_response(result_for(result, instance))

    async def start(self) -> FaultServer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/openapi.json", self._openapi)
        app.router.add_post("/run", self._run)
        if self.first_wave:
            self._first_wave_in = asyncio.Event()
        if self.graded_after:
            self._graded_in = asyncio.Event()
        self._runner = web.AppRunner(app, handler_cancellation=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=2048).start()
        return self

    async def stop(self) -> None:
        self.release.set()
        if self._first_wave_in is not None:
            self._first_wave_in.set()  # a wave that never filled must not hang the shutdown
        if self._graded_in is not None:
            self._graded_in.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@pytest.fixture
def gym_in_thread(gym_example_rollouts: list[dict[str, Any]]) -> Iterator[FaultServer]:
    """A ``FaultServer`` answering the wheel's five real results, served from its own thread
    (the CLI under test runs its own event loop); stopped after the test."""
    with serving_in_thread(FaultServer.of_results(gym_example_rollouts)) as server:
        yield server


class ResetAfterBodyServer:
    """Reads a whole ``/run`` request, then resets the connection (RST) without answering."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests = 0
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.decode("latin-1").split("\r\n"):
            if line.lower().startswith("content-length:"):
                length = int(line.split(":", 1)[1])
        await reader.readexactly(length)
        self.requests += 1
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def start(self) -> ResetAfterBodyServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
