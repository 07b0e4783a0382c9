"""A golden scan's check that the server is golden: a policy endpoint no golden server calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp import web

from miles_nemogym.episode import run as swe_run
from miles_nemogym.transport import bracket, is_loopback

__all__ = ["GoldenGuard", "golden_guard"]


@dataclass
class GoldenGuard:
    """``url``: the ``policy_base_url`` to send; ``called`` is set by the first request to it."""

    url: str = ""
    called: asyncio.Event = field(default_factory=asyncio.Event)
    request_line: str = ""

    def problem(self, run_url: str) -> str:
        """What the scan says when ``called``: the server is not golden, and the fix."""
        return (
            f"{run_url} is not a golden server: its /run called a model ({self.request_line} on the check endpoint "
            "a golden scan sends as policy_base_url), so it plays the task with a model instead of applying the "
            "gold patch; restart it with `miles-nemogym serve --golden` (or scan a policy with --policy-base-url)"
        )

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if not self.called.is_set():
            self.request_line = f"{request.method} {request.path}"
            self.called.set()
        return web.json_response({"error": {"message": "a golden scan's server must not call a model"}}, status=400)


@asynccontextmanager
async def golden_guard(gym_url: str, external_host: str | None) -> AsyncIterator[GoldenGuard]:
    """A :class:`GoldenGuard` listening until the block ends: on loopback for a server on this
    machine, else on every interface, its URL's host the address that routes to the Gym host
    (or ``MILES_ROUTER_EXTERNAL_HOST``)."""
    guard = GoldenGuard()
    host = "127.0.0.1" if is_loopback(urlsplit(gym_url).hostname or "") and not external_host else "0.0.0.0"
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", guard._answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        guard.url = swe_run.policy_base_url(f"http://{bracket(host)}:{port}/golden-check", gym_url, external_host)
        yield guard
    finally:
        await runner.cleanup()
