"""A loopback ``/run`` server that injects faults, for the client's fault matrix.

It answers with the real response shapes shipped in the nemo-gym wheel, and records
every request it receives so tests can assert how many episodes were started.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.mini_swe_agent import call_policy
from tests.support.ports import free_port

EARLY_ERRORS = frozenset({"500", "422", "echo_key_422", "nonjson"})


@dataclass
class FaultServer:
    """``mode``: ok | hold | 500 | 422 | nonjson | error_metadata | echo_key_error.

    ``respond``, when set, builds the answer from the request body instead (any shape,
    headers or encoding a test needs)."""

    result: dict[str, Any]
    mode: str = "ok"
    respond: Callable[[dict[str, Any]], web.Response] | None = None
    hold_s: float = 0.0
    port: int = field(default_factory=free_port)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    disconnects: int = 0
    peers: set[tuple[str, int]] = field(default_factory=set)
    results_by_instance: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Answer an instance with its own real result (else ``result``), as the real server would."""
    fault_instances: frozenset[str] | None = None
    """When set, ``mode`` applies only to these instances; the others get ``ok``."""
    error_note: str = ""
    """Starts the 422 modes' error message: the agent logs each distinct configuration error
    once per process, so a test that counts log lines gives its own note."""
    policy_calls: int = 0
    """Chat completions to make on the request's ``policy_base_url`` before answering, as an
    episode does: Miles' session server only turns a session with model calls into a sample."""
    _runner: web.AppRunner | None = None

    @classmethod
    def with_fault(cls, results: dict[str, dict[str, Any]], instance_id: str, mode: str) -> FaultServer:
        """Each instance gets its own real result from ``results`` (by id), except ``instance_id``,
        which gets ``mode``; each episode first makes one policy call, as a real one does."""
        return cls(
            result=results[instance_id],
            results_by_instance=results,
            mode=mode,
            fault_instances=frozenset({instance_id}),
            policy_calls=1,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _run(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer:
            self.peers.add(tuple(peer[:2]))
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        instance = str(body.get("instance_id"))
        result = self.results_by_instance.get(instance, self.result)
        mode = self.mode if self.fault_instances is None or instance in self.fault_instances else "ok"
        try:
            # An error answer comes before any episode work: no model call.
            for turn in range(0 if mode in EARLY_ERRORS else self.policy_calls):
                await call_policy(body, turn)
            waited = 0.0
            while waited < self.hold_s:
                await asyncio.sleep(0.05)
                waited += 0.05
                if request.transport is None or request.transport.is_closing():
                    self.disconnects += 1
                    return web.Response(status=499)
        finally:
            self.in_flight -= 1
        if self.respond is not None:
            return self.respond(body)
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
        if mode == "nonjson":
            return web.Response(status=200, text="<html>proxy error</html>", content_type="text/html")
        if mode == "error_metadata":
            return web.json_response(
                {**result, "reward": 0.0, "metadata": {"error": "eval script failed", "traceback": "Tb..."}}
            )
        if mode == "echo_key_error":
            key = body.get("policy_api_key", "")
            return web.json_response(
                {**result, "reward": 0.0, "metadata": {"error": f"auth failed for {key}", "traceback": key}}
            )
        return web.json_response({**result, "instance_id": body.get("instance_id")})

    async def start(self) -> FaultServer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/run", self._run)
        self._runner = web.AppRunner(app, handler_cancellation=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=2048).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


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
