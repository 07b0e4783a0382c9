"""A loopback stand-in for a NeMo-Gym resources server, with switchable failures.

Follows the 0.7.0 contract (``nemo_gym/base_resources_server.py``): ``POST /seed_session``
takes the task row and sets the session cookie, ``POST /<tool>`` answers the tool's raw
body, ``POST /verify`` takes the row + ``response`` and answers it back with ``reward``.
Tools: ``echo`` (answers its arguments and the session it saw), ``status`` (answers
``{"code": n}``'s HTTP status with a text body), ``huge`` (``{"size": n}`` bytes),
``drop`` (closes the connection without answering), ``moved`` (a 307 to ``{"to": url}``).
A GET of any path answers ``{"reward": ...}``: what a server elsewhere says to a redirect
turned into a GET. ``respond`` replaces an endpoint's answer (a hostile server's part), ``stall``
holds one, and every request is counted as it arrives (``received``, ``max_in_flight``).
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

COOKIE = "session"
TOOLS = ("echo", "status", "huge", "drop", "moved")
"""The tools the stand-in serves, which ``row`` declares (a loop calls only a row's declared tools)."""


@dataclass
class FakeResources:
    """``seed``/``verify``: ``"ok"``, ``"500"``, ``"garbage"`` or, for verify, ``"no_reward"``/``"masked"``."""

    seed: str = "ok"
    verify: str = "ok"
    reward: Any = 1.0
    """What ``/verify`` sends as ``reward`` (any JSON value: a hostile server's may not be a number)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields the environment adds to its ``/verify`` answer (mcqa's ``extracted_answer``...)."""
    respond: dict[str, Callable[[Any], web.StreamResponse]] = field(default_factory=dict)
    """Endpoint (``seed_session``, ``verify`` or a tool) -> its answer made from the request's
    JSON body, instead of the stand-in's own (the request is still recorded)."""
    delay: float = 0.0
    url: str = ""
    seeded: dict[str, Any] = field(default_factory=dict)
    """Session cookie -> the row it was seeded with."""
    tool_calls: list[tuple[str | None, str, Any]] = field(default_factory=list)
    """(session cookie, tool, arguments) per tool call."""
    verified: list[dict[str, Any]] = field(default_factory=list)
    verify_sessions: list[str | None] = field(default_factory=list)
    """The session cookie each ``/verify`` carried, in order."""
    peers: set[Any] = field(default_factory=set)
    """The client address of every connection a request came on (keep-alive reuse shows here)."""
    received: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(method, path, session cookie) of every request, whatever its path, as it arrived."""
    in_flight: int = 0
    max_in_flight: int = 0
    """The most requests the server was answering at once."""
    stall: frozenset[str] = frozenset()
    """Endpoints (``seed_session``, ``verify`` or a tool) that read their request and never answer
    until ``release`` is set (the block's end sets it): a server that holds a delivered request."""
    stalled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a request to a ``stall`` endpoint arrived."""
    release: asyncio.Event = field(default_factory=asyncio.Event)

    @web.middleware
    async def _count(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.received.append((request.method, request.path, request.cookies.get(COOKIE)))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if request.path.rsplit("/", 1)[-1] in self.stall:
                await request.read()
                self.stalled.set()
                await self.release.wait()
            return await handler(request)
        finally:
            self.in_flight -= 1

    async def _seed(self, request: web.Request) -> web.StreamResponse:
        self.peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        await asyncio.sleep(self.delay)
        if "seed_session" in self.respond:
            return self.respond["seed_session"](await request.json())
        if self.seed == "500":  # a JSON error body: the status alone says it failed
            return web.json_response({"detail": "seed failed"}, status=500)
        if self.seed == "garbage":
            return web.Response(text="<html>proxy</html>")
        session = uuid.uuid4().hex
        self.seeded[session] = await request.json()
        response = web.json_response({})
        response.set_cookie(COOKIE, session)
        return response

    async def _tool(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(self.delay)
        name = request.match_info["tool"]
        arguments = await request.json()
        session = request.cookies.get(COOKIE)
        self.tool_calls.append((session, name, arguments))
        if name in self.respond:
            return self.respond[name](arguments)
        if name == "echo":
            return web.json_response({"arguments": arguments, "session": session})
        if name == "status":
            return web.Response(status=int(arguments["code"]), text=f"tool failed with {arguments['code']}")
        if name == "drop":  # the connection breaks before any answer
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if name == "huge":
            return web.Response(body=b"x" * int(arguments["size"]))
        if name == "moved":
            return web.Response(status=307, headers={"Location": arguments["to"]}, text="moved")
        return web.json_response({"detail": "Not Found"}, status=404)

    async def _verify(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(self.delay)
        body = await request.json()
        self.verified.append(body)
        self.verify_sessions.append(request.cookies.get(COOKIE))
        if "verify" in self.respond:
            return self.respond["verify"](body)
        if self.verify == "500":
            return web.Response(status=500, text="Internal Server Error")
        if self.verify == "garbage":
            return web.Response(text="not json")
        if self.verify == "no_reward":
            return web.json_response(body)
        if self.verify == "masked":
            return web.json_response(
                {
                    **body,
                    "reward": 0.0,
                    "mask_sample": True,
                    "failure_kind": "judge_failed",
                    "failure_reason": "judge down",
                }
            )
        return web.json_response({**body, **self.extra, "reward": self.reward})

    async def _get(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"reward": self.reward})


@asynccontextmanager
async def fake_resources(
    port: int = 0, tls: ssl.SSLContext | None = None, prefix: str = "", **options: Any
) -> AsyncIterator[FakeResources]:
    """A ``FakeResources`` listening on ``port`` (0: any free one), over https with ``tls``,
    its endpoints under the path ``prefix`` (``url`` is the server's root), until the block ends."""
    fake = FakeResources(**options)
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[fake._count])
    app.router.add_post(f"{prefix}/seed_session", fake._seed)
    app.router.add_post(f"{prefix}/verify", fake._verify)
    app.router.add_post(prefix + "/{tool}", fake._tool)
    app.router.add_get("/{path:.*}", fake._get)
    async with on_loopback(app, port, tls) as fake.url:
        try:
            yield fake
        finally:
            fake.release.set()


@asynccontextmanager
async def on_loopback(app: web.Application, port: int = 0, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """``app`` served on loopback ``port`` (0: any free one), over https with ``tls``: its root URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls)
    await site.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def row(tag: str, **fields: Any) -> dict[str, Any]:
    """A minimal task row whose prompt carries the scripted-policy tag."""
    params = {
        "input": [{"role": "user", "content": f"do it {tag}"}],
        "tools": [
            {"type": "function", "name": name, "parameters": {"type": "object"}, "strict": False} for name in TOOLS
        ],
    }
    return {"responses_create_params": params, **fields}
