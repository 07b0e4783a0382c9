"""A loopback NeMo-Gym ``/run`` server for the scan tests, in its own thread.

It answers ``POST /run`` with the real ``/run`` results shipped in the nemo-gym wheel
(matched by ``instance_id``), or with the fault a test asks for per instance: an HTTP
500, a crashed episode's ``{error, traceback}`` metadata, an answer echoing the API key,
or a hold until the test releases it. It serves ``/openapi.json`` listing ``POST /run``
like the real FastAPI app. A thread (not the test's event loop) runs it, so the scan
can be driven through its CLI, in-process or as a subprocess.

Registered as a pytest plugin in ``tests/conftest.py``: every test module gets the
``fake_gym`` fixture (the server over the wheel's five results).
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from tests.support.openapi import openapi_document

OPENAPI = openapi_document()


class FakeGym:
    """``behaviour[instance_id]``: ``ok`` (default) | ``500`` | ``error`` | ``echo_key`` | ``hold``."""

    def __init__(self, rollouts: list[dict[str, Any]], openapi: dict[str, Any] | None = None) -> None:
        self.rollouts = {row["instance_id"]: copy.deepcopy(row) for row in rollouts}
        self.openapi = OPENAPI if openapi is None else openapi
        self.behaviour: dict[str, str] = {}
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.bodies: list[dict[str, Any]] = []
        self.held: set[str] = set()
        self.disconnected: list[str] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def received_ids(self) -> list[str]:
        with self._lock:
            return [body["instance_id"] for body in self.bodies]

    def held_now(self) -> set[str]:
        with self._lock:
            return set(self.held)

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(self.openapi)

    async def _run(self, request: web.Request) -> web.Response:
        body = await request.json()
        instance_id = body["instance_id"]
        with self._lock:
            self.bodies.append(body)
        behaviour = self.behaviour.get(instance_id, "ok")
        result = copy.deepcopy(self.rollouts[instance_id])
        if behaviour == "hold":
            with self._lock:
                self.held.add(instance_id)
            try:
                while not self.release.is_set():
                    await asyncio.sleep(0.02)
                    if request.transport is None or request.transport.is_closing():
                        with self._lock:
                            self.disconnected.append(instance_id)
                        return web.Response(status=499)
            finally:
                with self._lock:
                    self.held.discard(instance_id)
        if behaviour == "500":
            return web.Response(status=500, text="Internal Server Error")
        if behaviour == "error":
            # What the real server sends when building the eval script fails offline.
            result.update(
                reward=0.0,
                metadata={
                    "error": "Failed to build eval script: no network",
                    "traceback": 'Traceback (most recent call last):\n  File "app.py"\nRuntimeError',
                },
            )
        if behaviour == "echo_key":
            key = body.get("policy_api_key", "")
            result.update(
                reward=0.0,
                metadata={"error": f"401 from policy: bad key {key}", "traceback": f"AuthError({key})"},
                mask_sample=True,
                failure_kind="provider_unavailable",
                failure_reason=f"policy rejected api key {key}",
            )
        return web.json_response(result)

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/openapi.json", self._openapi)
        app.router.add_post("/run", self._run)
        self._runner = web.AppRunner(app, handler_cancellation=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    def start(self) -> FakeGym:
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.run_until_complete(self._start())
            started.set()
            loop.run_forever()
            assert self._runner is not None
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        assert started.wait(10), "fake gym did not start"
        return self

    def stop(self) -> None:
        self.release.set()
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


@pytest.fixture
def fake_gym(gym_example_rollouts: list[dict[str, Any]]) -> Iterator[FakeGym]:
    """A started ``FakeGym`` answering the wheel's five real results; stopped after the test."""
    gym = FakeGym(gym_example_rollouts).start()
    try:
        yield gym
    finally:
        gym.stop()
