"""A stand-in NeMo-Gym ``POST /run`` server for the client benchmarks (bench/agent_bench.py).

It does no work of its own: it reads the request body and answers with a fixed,
pre-encoded ``/run`` result (a real rollout from the nemo-gym wheel, chosen by the
benchmark), either at once or after holding the request ``--hold`` seconds, like a
NeMo-Gym server whose episode takes that long. ``POST /warm/run`` always answers at
once, so clients can open their pools before a held measurement.

It runs in its own process(es), so the client under test never shares a core's event
loop with it. ``--workers N`` forks N accepting processes on one ``SO_REUSEPORT``
socket address for the case where one server process would limit the measurement.
Counters (requests served, requests in flight and the peak of that) live in shared
memory so the benchmark can check, e.g., that all 1,000 burst requests were held at once.

Protocol with the parent: one JSON line on stdout once every worker listens
(``{"port": ..., "pids": [...]}``); ``GET /_stats`` and ``POST /_reset`` for counters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import resource
import signal
import socket
import sys
from typing import Any

from aiohttp import web

BACKLOG = 4096  # a 1,000-connection burst must not overflow the accept queue (SYN retries cost 1 s+)


class Counters:
    """Cross-process request counters in shared memory."""

    def __init__(self) -> None:
        self.lock = mp.Lock()
        self.served = mp.RawValue("q", 0)
        self.in_flight = mp.RawValue("q", 0)
        self.peak = mp.RawValue("q", 0)
        self.bytes_in = mp.RawValue("q", 0)

    def enter(self, size: int) -> None:
        with self.lock:
            self.in_flight.value += 1
            self.bytes_in.value += size
            if self.in_flight.value > self.peak.value:
                self.peak.value = self.in_flight.value

    def leave(self) -> None:
        with self.lock:
            self.in_flight.value -= 1
            self.served.value += 1

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {
                "served": self.served.value,
                "in_flight": self.in_flight.value,
                "peak_in_flight": self.peak.value,
                "bytes_in": self.bytes_in.value,
            }

    def reset(self) -> None:
        with self.lock:
            self.served.value = 0
            self.peak.value = self.in_flight.value
            self.bytes_in.value = 0


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def make_app(body: bytes, hold_s: float, counters: Counters) -> web.Application:
    async def run(request: web.Request, hold: float) -> web.Response:
        payload = await request.read()
        if not payload:
            return web.Response(status=422, text='{"detail": "empty body"}', content_type="application/json")
        counters.enter(len(payload))
        try:
            if hold > 0:
                await asyncio.sleep(hold)
            return web.Response(body=body, content_type="application/json")
        finally:
            counters.leave()

    async def held(request: web.Request) -> web.Response:
        return await run(request, hold_s)

    async def warm(request: web.Request) -> web.Response:
        return await run(request, 0.0)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(counters.snapshot())

    async def reset(request: web.Request) -> web.Response:
        counters.reset()
        return web.json_response(counters.snapshot())

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/run", held)
    app.router.add_post("/warm/run", warm)
    app.router.add_get("/_stats", stats)
    app.router.add_post("/_reset", reset)
    return app


def serve(sock: socket.socket, body: bytes, hold_s: float, counters: Counters) -> None:
    """One worker: an aiohttp server on an already-bound listening socket."""
    raise_fd_limit()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    async def main() -> None:
        runner = web.AppRunner(make_app(body, hold_s, counters), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.SockSite(runner, sock, backlog=BACKLOG)
        await site.start()
        await asyncio.Event().wait()

    asyncio.run(main())


def bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(BACKLOG)
    return sock


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--body-file", required=True, help="the /run result to answer with (JSON)")
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to hold each POST /run")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)

    with open(args.body_file, "rb") as handle:
        body = handle.read()
    json.loads(body)  # fail early on a broken body file

    counters = Counters()
    first = bind(0)
    port = first.getsockname()[1]
    sockets = [first] + [bind(port) for _ in range(args.workers - 1)]
    context = mp.get_context("fork")
    workers: list[Any] = []
    for sock in sockets:
        process = context.Process(target=serve, args=(sock, body, args.hold, counters), daemon=True)
        process.start()
        workers.append(process)
        sock.close()

    def stop(*_: object) -> None:
        for process in workers:
            process.terminate()
        for process in workers:
            process.join(5)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps({"port": port, "pids": [p.pid for p in workers]}), flush=True)
    for process in workers:
        process.join()


if __name__ == "__main__":
    main()
