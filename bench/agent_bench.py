"""Benchmark of the Miles agent function against the upstream approach and the practical limit.

A rollout step opens hundreds of ``/run`` requests at once, each held for the
whole episode, in the same event loop as Miles' session server. The client must never
be the bottleneck. This script measures, side by side in one invocation:

  a  ``miles_nemogym.agent.run``, awaited as Miles awaits it (keyword arguments, a real
     task row plus Miles' bookkeeping keys as ``metadata``, the trainer's sampling
     parameters as ``request_kwargs``);
  b  one ``aiohttp.ClientSession`` (unlimited pool) posting the same ``/run`` body and
     decoding the JSON answer: the practical limit of a Python client here;
  c  the upstream Miles NeMo-Gym example (``examples/experimental/nemo-gym/
     nemogym_agent_function.py``): a new ``httpx.AsyncClient(timeout=None)`` per call,
     inside ``asyncio.wait_for``;
  d  Miles' Harbor connector (``examples/swe-agent-harbor-docker/swe_agent_function.py``):
     one ``httpx.AsyncClient(transport=AsyncHTTPTransport(socket_options=<TCP
     keepalive>, limits=Limits(max_connections=None, max_keepalive_connections=32)),
     timeout=None)`` per loop, inside ``asyncio.wait_for``.

Scenarios:
  saturation  N quick calls (default 4,000) at concurrency C (256): calls/s.
              Goals: a/b >= 0.8, a/c >= 3.
  burst       B concurrent calls (1,000) held H seconds (10) by the server: wall time,
              worst event-loop stall seen by a 50 ms ticker in the same loop, client
              RSS growth per in-flight episode. Goals: wall(a) <= 1.2 x wall(b),
              worst stall of (a) <= 1 s.

The server (bench/_server.py, aiohttp.web) runs in its own process and answers every
``/run`` with one real, unmodified rollout from the pinned nemo-gym wheel (by default
the median-sized one of the five). Each (client, scenario, repeat) runs in a fresh
Python process with a fresh event loop, after a short warm-up against ``/warm/run``
(answered at once) so pools and lazy imports exist as they would in a running trainer.
The server's CPU use is measured during every run and reported, so a server-bound
result shows up as such.

    python bench/agent_bench.py            # full run, ~6 minutes
    python bench/agent_bench.py --quick    # scaled down sanity run, ~30 s

On a shared machine, give the run priority (``nice -n -10 python bench/...``, as root):
every process of the run inherits it, and the report records the niceness. Beside the
wall-clock ratio, the report gives a/b in calls per client-CPU-second, which other load
barely moves.

Prints a table and writes a JSON report to bench/reports/.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _server import raise_fd_limit  # noqa: E402

CLIENTS = {
    "a": "miles_nemogym.agent.run",
    "b": "one aiohttp session (practical limit)",
    "c": "httpx client per call (upstream example)",
    "d": "pooled httpx client (Harbor connector)",
}
BASELINES = frozenset("cd")  # the upstream approaches, far slower than a and b
SHORT = {"a": "a agent.run", "b": "b aiohttp", "c": "c httpx/call", "d": "d httpx pool"}
SCENARIOS = ("saturation", "burst")
TICK_S = 0.05
REQUEST_KWARGS = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8192, "top_k": -1, "seed": 1234}
SESSION_SERVER = "127.0.0.1:30000"  # Miles' session server, as it appears in base_url
MAX_SEQ_LEN = 32768
# The Harbor connector's TCP keepalive options (idle 60 s, interval 30 s, 5 probes).
HARBOR_SOCKET_OPTIONS = [
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", 4), 60),
    (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", 5), 30),
    (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", 6), 5),
]


# ---------------------------------------------------------------------------
# Worker: one client, one scenario, one fresh process and event loop.
# ---------------------------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu_seconds() -> float:
    # Not os.times(): its clock-tick granularity (10 ms) reads a short run as 0 CPU.
    return time.process_time()


def process_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of other processes (the server's), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def miles_calls(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The keyword arguments Miles would await the agent function with, one per sample."""
    metadatas = [{**row, "max_seq_len": MAX_SEQ_LEN, "session_server_id": SESSION_SERVER} for row in rows]
    prompts = [[{"role": "user", "content": row["problem_statement"]}] for row in rows]
    return [
        {
            "base_url": f"http://{SESSION_SERVER}/sessions/bench-{i:06d}",
            "prompt": prompts[i % len(rows)],
            "request_kwargs": dict(REQUEST_KWARGS),
            "metadata": metadatas[i % len(rows)],
        }
        for i in range(n)
    ]


def equivalent_bodies(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The /run bodies the agent function sends for these rows (policy URL set per call)."""
    from miles_nemogym.episode.run import build_run_body

    calls = miles_calls(rows, len(rows))
    return [build_run_body(call["metadata"], call["request_kwargs"], policy_base_url="placeholder") for call in calls]


def reset_server_counters(base: str) -> dict[str, Any]:
    request = urllib.request.Request(base + "/_reset", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


Call = Callable[[int], Awaitable[bool]]


async def make_client(kind: str, target: dict[str, str], rows: list[dict[str, Any]], n: int) -> tuple[Call, Any]:
    """(call(i) -> ok, closer) for client ``kind``, posting to ``target["base"]``/run.

    The target can move (warm-up to measurement) without replacing the client's pool.
    """
    if kind == "a":
        from miles_nemogym import agent

        calls = miles_calls(rows, n)

        async def call_a(i: int) -> bool:
            result = await agent.run(**calls[i])
            if result["nemogym"]["status"] != "ok":
                raise RuntimeError(f"episode failed: {result['nemogym']}")
            return True

        async def close_a() -> None:
            from miles_nemogym.transport import close_pools

            await close_pools()

        return call_a, close_a

    bodies = equivalent_bodies(rows)
    policy_urls = [f"http://{SESSION_SERVER}/sessions/bench-{i:06d}/v1" for i in range(n)]

    if kind == "b":
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        headers = {"Content-Type": "application/json"}

        async def call_b(i: int) -> bool:
            payload = json.dumps({**bodies[i % len(bodies)], "policy_base_url": policy_urls[i]}).encode()
            async with session.post(target["base"] + "/run", data=payload, headers=headers) as response:
                raw = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}")
            return "reward" in json.loads(raw)

        return call_b, session.close

    import httpx

    if kind == "c":
        # The upstream example: a client per call, no HTTP timeout, the episode bounded by wait_for.
        async def post_json(url: str, payload: dict[str, Any]) -> dict[str, Any]:
            async with httpx.AsyncClient(timeout=None) as client:
                response = await client.post(url, json=payload)
                response.raise_for_status()
                result: dict[str, Any] = response.json()
                return result

        async def call_c(i: int) -> bool:
            payload = {**bodies[i % len(bodies)], "policy_base_url": policy_urls[i]}
            response = await asyncio.wait_for(post_json(target["base"] + "/run", payload), timeout=3600)
            return "reward" in response

        async def close_c() -> None:
            return None

        return call_c, close_c

    if kind == "d":
        transport = httpx.AsyncHTTPTransport(
            socket_options=HARBOR_SOCKET_OPTIONS,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
        )
        pooled = httpx.AsyncClient(transport=transport, timeout=None)

        async def post_pooled(url: str, payload: dict[str, Any]) -> dict[str, Any]:
            response = await pooled.post(url, json=payload)
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result

        async def call_d(i: int) -> bool:
            payload = {**bodies[i % len(bodies)], "policy_base_url": policy_urls[i]}
            response = await asyncio.wait_for(post_pooled(target["base"] + "/run", payload), timeout=7200)
            return "reward" in response

        return call_d, pooled.aclose

    raise ValueError(f"unknown client {kind!r}; choose from {', '.join(CLIENTS)}")


async def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Warm up, then run ``n`` calls at ``concurrency`` with a stall ticker alongside."""
    from miles_nemogym.gym import wheel as gym_wheel

    # The row of the rollout the server answers with: the agent refuses a result for
    # another instance than the one it sent.
    rows = [row for row in gym_wheel.example_rows() if row["instance_id"] == spec["instance_id"]]
    kind, n, concurrency = spec["client"], spec["n"], spec["concurrency"]
    loop = asyncio.get_running_loop()

    # Warm up against /warm/run (answered at once), then move the target to the held /run;
    # the pool stays (the agent's is keyed by pool settings, not by URL).
    target = {"base": spec["base"] + "/warm"}
    os.environ["NEMO_GYM_URL"] = target["base"]
    store_dir = spec.get("episode_dir")
    if store_dir and kind == "a":
        os.environ["NEMO_GYM_EPISODE_DIR"] = store_dir  # the warm-up episodes are stored too
    call, close = await make_client(kind, target, rows, max(n, spec["warmup"]))
    await asyncio.gather(*(call(i) for i in range(spec["warmup"])))
    target["base"] = spec["base"]
    os.environ["NEMO_GYM_URL"] = target["base"]
    reset_server_counters(spec["base"])  # the server's counts then cover the measurement only
    gc.collect()

    ticks: list[tuple[float, float, int]] = []  # (time, lag, rss)
    stop = asyncio.Event()
    first_done: dict[str, float] = {}
    errors: list[str] = []
    ok = 0

    async def ticker() -> None:
        last = loop.time()
        while not stop.is_set():
            await asyncio.sleep(TICK_S)
            now = loop.time()
            ticks.append((now, now - last - TICK_S, rss_bytes()))
            last = now

    async def one(i: int) -> None:
        nonlocal ok
        try:
            good = await call(i)
        except Exception as error:  # counted and reported, never hidden
            good = False
            if len(errors) < 5:
                errors.append(f"{type(error).__name__}: {error}"[:300])
        else:
            if not good and len(errors) < 5:
                errors.append("answer without a reward")
        if "t" not in first_done:
            first_done["t"] = loop.time()
            first_done["rss"] = rss_bytes()
        ok += int(good)

    rss_base = rss_bytes()
    server_cpu_start = process_cpu_seconds(spec["server_pids"])
    cpu_start = cpu_seconds()
    loop_cpu_start = time.thread_time()  # this thread runs the event loop
    tick_task = loop.create_task(ticker())
    started = loop.time()
    if concurrency >= n:
        await asyncio.gather(*(one(i) for i in range(n)))
    else:
        counter = iter(range(n))

        async def worker() -> None:
            for i in counter:
                await one(i)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = loop.time() - started
    cpu = cpu_seconds() - cpu_start
    loop_cpu = time.thread_time() - loop_cpu_start
    server_cpu = process_cpu_seconds(spec["server_pids"]) - server_cpu_start
    stop.set()
    await tick_task
    await close()
    store: dict[str, Any] = {}
    if store_dir and kind == "a":
        # The store writes on its own thread while calls run; this is what is left at the end.
        from miles_nemogym.runtime import current

        flush_started = time.monotonic()
        episode_store = current().stores.get(store_dir)
        await asyncio.to_thread(episode_store.flush, 600.0)
        store_mb = await asyncio.to_thread(_folder_mb, store_dir)
        store = {
            "store_flush_after_s": time.monotonic() - flush_started,
            "store_lines": episode_store.lines_written,
            "store_answers_dropped": episode_store.answers_dropped,
            "store_write_errors": episode_store.write_errors,
            "store_mb": store_mb,
        }

    lags = [lag for _, lag, _ in ticks]
    worst_at = max(ticks, key=lambda tick: tick[1])[0] - started if ticks else 0.0
    first_t = first_done.get("t", float("inf"))
    in_flight_rss = [rss for t, _, rss in ticks if t < first_t] + [first_done.get("rss", rss_base)]
    peak_rss = max([rss for _, _, rss in ticks] + [rss_base])
    return {
        "client": kind,
        "scenario": spec["scenario"],
        "n": n,
        "concurrency": concurrency,
        "ok": ok,
        "errors": n - ok,
        "first_errors": errors,
        "wall_s": wall,
        "calls_per_s": n / wall,
        "worst_stall_s": max(lags, default=0.0),
        # When the worst tick ended, from the start of the run: near 0 means while starting
        # the calls, near the hold time means while the answers came back.
        "worst_stall_at_s": worst_at,
        "ticks": len(lags),
        "ticks_over_100ms": sum(1 for lag in lags if lag > 0.1),
        "client_cpu_s": cpu,
        "client_cpu_util": cpu / wall,
        "server_cpu_s": server_cpu,
        "server_cpu_util": server_cpu / wall,
        "client_cpu_per_call_ms": 1000 * cpu / n,
        # The rest of the client's CPU ran on other threads (the executor, the episode store's writer).
        "loop_thread_cpu_per_call_ms": 1000 * loop_cpu / n,
        "calls_per_cpu_s": n / cpu if cpu > 0 else float("inf"),
        "rss_base_mb": rss_base / 2**20,
        "rss_in_flight_delta_mb": (max(in_flight_rss) - rss_base) / 2**20,
        "rss_in_flight_per_episode_kb": (max(in_flight_rss) - rss_base) / 1024 / n,
        "rss_peak_delta_mb": (peak_rss - rss_base) / 2**20,
        **store,
    }


def _folder_mb(folder: str) -> float:
    return sum(f.stat().st_size for f in Path(folder).rglob("*.jsonl*")) / 2**20


def worker_main(spec_json: str) -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    raise_fd_limit()
    spec = json.loads(spec_json)
    result = asyncio.run(measure(spec))
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------
# Orchestrator: server process, runs, medians, goals, table, report.
# ---------------------------------------------------------------------------


class Server:
    """bench/_server.py in a child process (its own workers), with CPU accounting."""

    def __init__(self, body_file: Path, hold: float, workers: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "_server.py"), "--body-file", str(body_file),
             "--hold", str(hold), "--workers", str(workers)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the benchmark server did not start (see its stderr above)")
        info = json.loads(line)
        self.port: int = info["port"]
        self.pids: list[int] = info["pids"]
        self.base = f"http://127.0.0.1:{self.port}"

    def _request(self, method: str, path: str) -> dict[str, Any]:
        request = urllib.request.Request(self.base + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(request, timeout=10) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result

    def stats(self) -> dict[str, Any]:
        return self._request("GET", "/_stats")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def run_worker(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(
        f"worker {spec['client']}/{spec['scenario']} failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
    )


def choose_body(which: str) -> tuple[dict[str, Any], bytes]:
    from miles_nemogym.gym import wheel as gym_wheel

    rollouts = gym_wheel.example_rollouts()
    encoded = [json.dumps(rollout).encode() for rollout in rollouts]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    index = {"smallest": order[0], "median": order[len(order) // 2], "largest": order[-1]}[which]
    return rollouts[index], encoded[index]


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(run[key] for run in runs))


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [
        "calls_per_s", "wall_s", "worst_stall_s", "ticks_over_100ms", "client_cpu_per_call_ms",
        "rss_in_flight_per_episode_kb", "rss_in_flight_delta_mb", "rss_peak_delta_mb",
        "server_cpu_util", "client_cpu_util", "server_peak_in_flight", "calls_per_cpu_s",
        "loop_thread_cpu_per_call_ms",
    ]  # fmt: skip
    summary = {key: median_of(runs, key) for key in keys}
    summary["worst_stall_max_s"] = max(run["worst_stall_s"] for run in runs)
    summary["errors"] = sum(run["errors"] for run in runs)
    summary["repeats"] = len(runs)
    return summary


def evaluate_goals(results: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    goals: list[dict[str, Any]] = []
    sat = results.get("saturation", {})
    if {"a", "b"} <= sat.keys():
        ratio = sat["a"]["calls_per_s"] / sat["b"]["calls_per_s"]
        # Cross-check that a shared machine's noise cannot fake: the same ratio in calls per
        # second of client CPU (both clients are CPU-bound when the server is not).
        cpu_ratio = sat["a"]["calls_per_cpu_s"] / sat["b"]["calls_per_cpu_s"]
        goals.append(
            {"goal": "saturation a/b >= 0.8", "value": ratio, "met": ratio >= 0.8, "per_cpu_second": cpu_ratio}
        )
    if {"a", "c"} <= sat.keys():
        ratio = sat["a"]["calls_per_s"] / sat["c"]["calls_per_s"]
        goals.append({"goal": "saturation a/c >= 3", "value": ratio, "met": ratio >= 3})
    burst = results.get("burst", {})
    if {"a", "b"} <= burst.keys():
        ratio = burst["a"]["wall_s"] / burst["b"]["wall_s"]
        goals.append({"goal": "burst wall(a) <= 1.2 x wall(b)", "value": ratio, "met": ratio <= 1.2})
    if "a" in burst:
        stall = burst["a"]["worst_stall_max_s"]
        goals.append({"goal": "burst worst stall of a <= 1 s", "value": stall, "met": stall <= 1.0})
    return goals


def print_tables(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 132))
    config = report["config"]
    for scenario, clients in report["results"].items():
        cfg = config[scenario]
        title = (
            f"{scenario}: {cfg['n']} calls, concurrency {cfg['concurrency']}, hold {cfg['hold_s']:g} s, "
            f"median of {cfg['repeats']} (c, d: {cfg['baseline_repeats']})"
        )
        table = Table(title=title)
        for column in ("client", "calls/s", "wall s", "worst stall s", "CPU ms/call",
                       "RSS KB/episode", "server CPU", "server peak", "errors"):  # fmt: skip
            table.add_column(column, justify="left" if column == "client" else "right")
        for kind, summary in clients.items():
            table.add_row(
                SHORT[kind],
                f"{summary['calls_per_s']:.0f}",
                f"{summary['wall_s']:.2f}",
                f"{summary['worst_stall_max_s']:.3f}",
                f"{summary['client_cpu_per_call_ms']:.3f}",
                f"{summary['rss_in_flight_per_episode_kb']:.1f}",
                f"{100 * summary['server_cpu_util']:.0f}%",
                f"{summary['server_peak_in_flight']:.0f}" if cfg["hold_s"] > 0 else "-",
                str(summary["errors"]),
            )
        console.print(table)
    console.print(
        "clients: " + "; ".join(f"{kind} = {label}" for kind, label in CLIENTS.items()) + ".\n"
        "worst stall: longest extra delay of a 50 ms ticker in the client's loop (max over repeats); "
        "CPU ms/call: client process CPU; RSS KB/episode: client RSS growth while all calls are in "
        "flight, per call; server CPU: share of one core used by the server; server peak: most "
        "requests the server held at once (burst only)."
    )
    goals = Table(title="goals")
    for column in ("goal", "measured", "met", "note"):
        goals.add_column(column)
    for goal in report["goals"]:
        note = f"per client CPU second: {goal['per_cpu_second']:.2f}" if "per_cpu_second" in goal else ""
        goals.add_row(goal["goal"], f"{goal['value']:.2f}", "yes" if goal["met"] else "[bold red]NO[/]", note)
    console.print(goals)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Benchmark miles_nemogym.agent.run against the upstream approaches.")
    parser.add_argument("--quick", action="store_true", help="scaled-down sanity run (~30 s)")
    parser.add_argument("--clients", default="abcd", help="which clients to run (default abcd)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="saturation,burst")
    parser.add_argument("--n", type=int, help="saturation: calls (default 4000; quick 400)")
    parser.add_argument("--concurrency", type=int, help="saturation: concurrency (default 256; quick 64)")
    parser.add_argument("--burst", type=int, help="burst: concurrent calls (default 1000; quick 200)")
    parser.add_argument("--hold", type=float, help="burst: seconds each call is held (default 10; quick 2)")
    parser.add_argument("--repeats", type=int, help="saturation repeats (default 3; quick 1)")
    parser.add_argument("--burst-repeats", type=int, help="burst repeats (default 1)")
    parser.add_argument(
        "--baseline-repeats", type=int, default=1,
        help="saturation repeats of the slow baselines c and d (default 1: at 10-50x below a, noise "
        "cannot change a goal, and c alone takes minutes per repeat)",
    )  # fmt: skip
    parser.add_argument("--warmup", type=int, default=8, help="warm-up calls per run (default 8)")
    parser.add_argument("--body", choices=("smallest", "median", "largest"), default="median",
                        help="which of the five real rollouts the server answers with")  # fmt: skip
    parser.add_argument("--server-workers", type=int, default=1, help="server processes (SO_REUSEPORT)")
    parser.add_argument("--out", type=Path, help="report path (default bench/reports/agent_bench-<time>.json)")
    parser.add_argument(
        "--episode-store", action="store_true",
        help="client a with the episode store on (NEMO_GYM_EPISODE_DIR in a temporary folder): every "
        "episode's answer written to disk by the store's writer thread",
    )  # fmt: skip
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    args.n = args.n or (400 if quick else 4000)
    args.concurrency = args.concurrency or (64 if quick else 256)
    args.burst = args.burst or (200 if quick else 1000)
    args.hold = args.hold if args.hold is not None else (2.0 if quick else 10.0)
    args.repeats = args.repeats or (1 if quick else 3)
    args.burst_repeats = args.burst_repeats or 1
    unknown = set(args.clients) - set(CLIENTS)
    if unknown:
        parser.error(f"--clients: unknown client(s) {''.join(sorted(unknown))}; choose from abcd")
    args.scenario_list = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for scenario in args.scenario_list:
        if scenario not in SCENARIOS:
            parser.error(f"--scenarios: unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker)
        return 0
    fd_limit = raise_fd_limit()
    needed = 2 * max(args.burst, args.concurrency) + 256
    if fd_limit < needed:
        print(f"warning: RLIMIT_NOFILE is {fd_limit}, below the ~{needed} sockets this run opens", file=sys.stderr)

    import aiohttp
    import httpx
    import pydantic

    rollout, body = choose_body(args.body)
    scenario_config = {
        "saturation": {
            "n": args.n,
            "concurrency": args.concurrency,
            "hold_s": 0.0,
            "repeats": args.repeats,
            "baseline_repeats": min(args.baseline_repeats, args.repeats),
        },
        "burst": {
            "n": args.burst,
            "concurrency": args.burst,
            "hold_s": args.hold,
            "repeats": args.burst_repeats,
            "baseline_repeats": args.burst_repeats,
        },
    }
    report: dict[str, Any] = {
        "benchmark": "agent_bench",
        "command": " ".join(["python", "bench/agent_bench.py", *(argv if argv is not None else sys.argv[1:])]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "aiohttp": aiohttp.__version__,
            "httpx": httpx.__version__,
            "pydantic": pydantic.VERSION,
            "loadavg_start": os.getloadavg(),
            "rlimit_nofile": fd_limit,
            "event_loop": "asyncio default (no uvloop)",
            "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        },
        "server": {
            "kind": "aiohttp.web, separate process",
            "workers": args.server_workers,
            "body": f"real nemo-gym example rollout {rollout['instance_id']} ({args.body} of 5), unmodified",
            "body_bytes": len(body),
        },
        "clients": CLIENTS,
        "episode_store": bool(args.episode_store),
        "config": {s: scenario_config[s] for s in args.scenario_list},
        "runs": [],
        "results": {},
    }

    with tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp) / "rollout.json"
        body_file.write_bytes(body)
        for scenario in args.scenario_list:
            cfg = scenario_config[scenario]
            server = Server(body_file, cfg["hold_s"], args.server_workers)
            try:
                runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in args.clients}
                for repeat in range(cfg["repeats"]):
                    order = args.clients[repeat % len(args.clients) :] + args.clients[: repeat % len(args.clients)]
                    for kind in order:
                        if kind in BASELINES and repeat >= cfg["baseline_repeats"]:
                            continue
                        spec = {
                            "client": kind, "scenario": scenario, "n": cfg["n"],
                            "concurrency": cfg["concurrency"], "base": server.base, "warmup": args.warmup,
                            "server_pids": server.pids, "instance_id": rollout["instance_id"],
                            "episode_dir": tempfile.mkdtemp(dir=tmp) if args.episode_store else None,
                        }  # fmt: skip
                        result = run_worker(spec, timeout=max(600.0, 20 * cfg["hold_s"] + cfg["n"]))
                        stats = server.stats()
                        result["server_peak_in_flight"] = stats["peak_in_flight"]
                        result["server_served"] = stats["served"]
                        result["repeat"] = repeat
                        report["runs"].append(result)
                        runs[kind].append(result)
                        print(
                            f"{scenario:<10} {kind} rep {repeat}: {result['calls_per_s']:8.0f} calls/s  "
                            f"wall {result['wall_s']:6.2f} s  stall {result['worst_stall_s']:.3f} s "
                            f"(at {result['worst_stall_at_s']:.1f} s)  "
                            f"errors {result['errors']}  server CPU {result['server_cpu_util']:.0%}",
                            flush=True,
                        )
                report["results"][scenario] = {kind: summarize(kind_runs) for kind, kind_runs in runs.items()}
            finally:
                server.stop()

    report["environment"]["loadavg_end"] = os.getloadavg()
    report["goals"] = evaluate_goals(report["results"])
    out = args.out or HERE / "reports" / f"agent_bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print_tables(report)
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
