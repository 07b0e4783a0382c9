"""A loopback ``/run`` server that reads each request and then stalls, for the timeout tests:
``held`` never answers (the server plays the episode past the deadline); ``mid_answer`` sends
the status line, headers and the first bytes of the body, then stops (an answer cut mid-way).
``received`` is set when a request has been read; the block's end releases every stalled request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Stalling:
    mode: str
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


@asynccontextmanager
async def stalling_server(mode: str) -> AsyncIterator[Stalling]:
    """A ``Stalling`` server in ``mode`` (``held`` or ``mid_answer``) on a free loopback port."""
    server = Stalling(mode)
    app = web.Application()
    app.router.add_post("/{path:.*}", server._run)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        server.release.set()
        await runner.cleanup()
