"""A loopback ``/run`` server that reads each request and then stalls, for the timeout tests:
``held`` never answers (the server plays the episode past the deadline); ``mid_answer`` sends
the status line, headers and the first bytes of the body, then stops (an answer cut mid-way).
``received`` is set when a request has been read; the block's end releases every stalled request.
It is also the sample's Miles session: ``GET /sessions/<id>`` answers Miles' ``GetSessionResponse``
with ``calls`` answered model calls recorded (``session_url``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

from tests.support.fake_resources import on_loopback


@dataclass
class Stalling:
    mode: str
    calls: int = 0
    url: str = ""
    received: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def _run(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.received.set()
        if self.mode == "mid_answer":
            response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "64"})
            await response.prepare(request)
            await response.write(b'{"reward": ')
            await self.release.wait()
            return response
        await self.release.wait()
        return web.json_response({"reward": 1.0})

    async def _session(self, request: web.Request) -> web.Response:
        record = {"timestamp": 0.0, "method": "POST", "path": "/v1/chat/completions", "request": {}, "response": {}}
        records = [{**record, "status_code": 200}] * self.calls
        return web.json_response({"session_id": request.match_info["id"], "records": records, "metadata": {}})

    @property
    def session_url(self) -> str:
        return f"{self.url}/sessions/s-1"


@asynccontextmanager
async def stalling_server(mode: str, calls: int = 0) -> AsyncIterator[Stalling]:
    """A ``Stalling`` server in ``mode`` (``held`` or ``mid_answer``) on a free loopback port, its
    session holding ``calls`` model calls."""
    server = Stalling(mode, calls)
    app = web.Application()
    app.router.add_get("/sessions/{id}", server._session)
    app.router.add_post("/{path:.*}", server._run)
    async with on_loopback(app) as server.url:
        try:
            yield server
        finally:
            server.release.set()
