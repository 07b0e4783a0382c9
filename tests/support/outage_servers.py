"""Loopback ``/run`` servers that are hard to reach: one behind a TLS certificate no client trusts
(``tests.support.tls``), one that listens only part of the time (up ``up_s`` in every ``period_s``)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.fault_server import result_for
from tests.support.ports import free_port


@dataclass
class GradingServer:
    """Answers every ``/run`` with ``result`` graded for the instance sent, closing each
    connection after its answer (no keep-alive: every request connects anew). ``tls``: serve
    https. ``start``/``stop`` toggle the listening socket only, so it can flap."""

    result: dict[str, Any]
    tls: ssl.SSLContext | None = None
    port: int = field(default_factory=free_port)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    held: frozenset[str] = frozenset()
    """Instances whose ``/run`` is answered only once ``release`` is set (a long episode)."""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None
    _site: web.TCPSite | None = None
    _flapping: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def _run(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        if body.get("instance_id") in self.held:
            await self.release.wait()
        answer = result_for(self.result, str(body.get("instance_id")))
        return web.json_response(answer, headers={"Connection": "close"})

    async def start(self) -> GradingServer:
        if self._runner is None:
            app = web.Application()
            app.router.add_post("/run", self._run)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.tls)
        await self._site.start()
        return self

    async def stop_listening(self) -> None:
        if self._site is not None:
            await self._site.stop()
            self._site = None

    def flap(self, up_s: float, period_s: float) -> None:
        """From now on, listen ``up_s`` in every ``period_s`` (starting down)."""

        async def cycle() -> None:
            while True:
                await asyncio.sleep(period_s - up_s)
                await self.start()
                await asyncio.sleep(up_s)
                await self.stop_listening()

        self._flapping = asyncio.get_running_loop().create_task(cycle())

    async def close(self) -> None:
        self.release.set()
        if self._flapping is not None:
            self._flapping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flapping
        await self.stop_listening()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
