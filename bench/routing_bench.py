"""The routing hop, measured: what the routing model adds per model turn, and routed ``simple_agent``
``/run`` episodes against this package's in-process loop, in one run, side by side.

One instant scripted chat policy (its own process, answering at ``/sessions/<id>/v1/...`` as Miles'
session server does), and the real ``workplace_assistant`` resources server with its ``simple_agent``
and this package's routing model as ``policy_model``, started as ``serve --env workplace_assistant
--routed`` starts them (``miles_nemogym.gym.environments``). The episode: search an email, reply to
it, answer (3 model turns, 2 tool calls; reward 1.0, checked on every episode).

  hop         one call at a time, blocks alternating (ABAB, order flipped every round): a chat call
              straight to the session (``direct``), the same call through the routing model with the
              session's rollout id (``chat``), and a Responses call through it (``responses``: converted
              to chat and back, as ``vllm_model`` does); per call, routed minus direct, paired per round.
  throughput  ``--n`` episodes at ``--concurrency``: ``loop`` = this package's ``simple_agent`` loop
              (``environment.prepare`` + ``deliver``), ``routed`` = the agent row's ``POST /run`` to
              ``simple_agent`` (``run.prepare_agent`` + ``deliver``), its turns through the routing
              model; episodes/s of each and the ratio routed/loop per round, the order rotating.

    python bench/routing_bench.py [--quick] [--out bench/reports/routing_bench.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from miles_nemogym.episode import environment, run  # noqa: E402
from miles_nemogym.episode.record import Task  # noqa: E402
from miles_nemogym.gym.environments import EnvironmentServers, plan  # noqa: E402
from miles_nemogym.gym.venv import BuildLines, ensure_gym_venv  # noqa: E402
from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import (  # noqa: E402
    SECRET_VARIABLE,
    rollout_id,
)
from miles_nemogym.runtime import current, deliver  # noqa: E402
from miles_nemogym.settings import EnvironmentServer, Settings  # noqa: E402
from miles_nemogym.transport import close_pools  # noqa: E402
from tests.support.scripted_chat import ScriptedChat, Turn, tagged, tool  # noqa: E402

ENV = "workplace_assistant"
SCRIPT = "bench"
TURNS = 3
_JSON = {"Content-Type": "application/json"}
_PREFIX = "training-token-capture"
"""The path segment agents put after ``/ng-rollout/<id>`` under run-level token capture."""


def _serve_policy(port_out: Any, stop: Any, turns: list[Turn]) -> None:
    with ScriptedChat(max_requests=None) as chat:
        chat.script(SCRIPT, *turns)
        port_out.put(chat.port)
        stop.wait()


def _turns(row: dict[str, Any]) -> list[Turn]:
    reply = json.loads(row["ground_truth"][0]["arguments"])
    return [
        Turn(tool_calls=(tool("email_search_emails", query="Task Update"),)),
        Turn(tool_calls=(tool("email_reply_email", **reply),)),
        Turn(content="Replied."),
    ]


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    cut = len(ordered) // 10
    return {"median": statistics.median(ordered), "p10": ordered[cut], "p90": ordered[-1 - cut]}


async def _timed(n: int, concurrency: int, one: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """Wall seconds of ``n`` calls of ``one``, at most ``concurrency`` at once; the 1-minute load."""
    semaphore = asyncio.Semaphore(concurrency)

    async def guarded() -> None:
        async with semaphore:
            await one()

    load = os.getloadavg()[0]
    started = time.perf_counter()
    await asyncio.gather(*(guarded() for _ in range(n)))
    return time.perf_counter() - started, max(load, os.getloadavg()[0])


class _Clients:
    def __init__(self, servers: EnvironmentServers, policy: str, row: dict[str, Any], http: Any) -> None:
        self.http: aiohttp.ClientSession = http
        self.row = row
        self.session = f"{policy}/sessions/{uuid.uuid4().hex}"  # Miles' session-id shape: the routing model's rule
        self.settings = Settings.from_env({SECRET_VARIABLE: servers.rollout_secret})
        resources = servers.urls()[ENV]
        self.loop_server = EnvironmentServer(url=resources, max_steps=6)
        self.routed_server = EnvironmentServer(url=resources, agent=servers.agent_urls()[ENV])
        model = f"http://127.0.0.1:{servers.ports['policy_model']}"
        self.routed_v1 = f"{model}/ng-rollout/{rollout_id(self.session + '/v1', servers.rollout_secret)}/{_PREFIX}/v1"
        messages, body = environment.first_request(row["responses_create_params"], None)
        self.chat = json.dumps({**body, "messages": messages}).encode()
        self.responses = json.dumps(row["responses_create_params"]).encode()

    async def _post(self, url: str, data: bytes) -> dict[str, Any]:
        async with self.http.post(url, data=data, headers=_JSON) as answer:
            assert answer.status == 200, (url, answer.status, await answer.text())
            parsed: dict[str, Any] = json.loads(await answer.read())
            return parsed

    async def direct(self) -> None:
        await self._post(f"{self.session}/v1/chat/completions", self.chat)

    async def routed_chat(self) -> None:
        await self._post(f"{self.routed_v1}/chat/completions", self.chat)

    async def routed_responses(self) -> None:
        answer = await self._post(f"{self.routed_v1}/responses", self.responses)
        assert answer["object"] == "response", answer

    async def loop(self) -> None:
        episode = environment.prepare(
            Task.of(self.row, ENV),
            self.loop_server,
            session_url=self.session,
            request_kwargs=None,
            settings=self.settings,
        )
        outcome = await deliver(episode, self.settings, current().circuits, current().in_flight)
        assert outcome.reward == 1.0 and outcome.record.turns == TURNS, outcome.record

    async def routed(self) -> None:
        episode = run.prepare_agent(
            Task.of(self.row, ENV), None, self.routed_server, self.settings, session_url=self.session
        )
        outcome = await deliver(episode, self.settings, current().circuits, current().in_flight)
        assert outcome.reward == 1.0 and outcome.record.turns == TURNS, outcome.record


async def _hop(clients: _Clients, rounds: int, calls: int) -> dict[str, Any]:
    names = ["direct", "routed_chat", "routed_responses"]
    walls: dict[str, list[float]] = {name: [] for name in names}
    loads: list[float] = []
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            wall, load = await _timed(calls, 1, getattr(clients, name))
            walls[name].append(wall / calls * 1000)
            loads.append(load)
    return {
        "rounds": rounds,
        "calls_per_block": calls,
        "load": [min(loads), max(loads)],
        "ms_per_call": {name: _spread(walls[name]) for name in names},
        "chat_minus_direct_ms": _spread([r - d for r, d in zip(walls["routed_chat"], walls["direct"], strict=True)]),
        "responses_minus_direct_ms": _spread(
            [r - d for r, d in zip(walls["routed_responses"], walls["direct"], strict=True)]
        ),
    }


async def _throughput(clients: _Clients, rounds: int, n: int, concurrency: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"loop": [], "routed": []}
    loads: list[float] = []
    for index in range(rounds):
        for name in ("loop", "routed") if index % 2 == 0 else ("routed", "loop"):
            wall, load = await _timed(n, concurrency, getattr(clients, name))
            rates[name].append(n / wall)
            loads.append(load)
            print(f"  {name}: {n} episodes at concurrency {concurrency} in {wall:.2f} s", file=sys.stderr, flush=True)
    return {
        "rounds": rounds,
        "n": n,
        "concurrency": concurrency,
        "load": [min(loads), max(loads)],
        "episodes_per_s": {name: _spread(values) for name, values in rates.items()},
        "ratio_routed_over_loop": _spread([r / a for r, a in zip(rates["routed"], rates["loop"], strict=True)]),
    }


async def _measure(args: argparse.Namespace, servers: EnvironmentServers, policy: str, row: dict[str, Any]) -> Any:
    report: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
    ) as http:
        clients = _Clients(servers, policy, row, http)
        for probe in (clients.direct, clients.routed_chat, clients.routed_responses, clients.loop, clients.routed):
            await probe()
        report["hop"] = await _hop(clients, args.rounds, args.calls)
        report["throughput"] = await _throughput(clients, args.throughput_rounds, args.n, args.concurrency)
    await close_pools()
    return report


def _print(report: dict[str, Any]) -> None:
    hop = report["hop"]
    print(
        f"\nrouting hop, one call at a time ({hop['rounds']} rounds x {hop['calls_per_block']} calls, load "
        f"{hop['load'][0]:.1f}-{hop['load'][1]:.1f}), ms per call: median [p10, p90]"
    )
    for name, spread in hop["ms_per_call"].items():
        print(f"  {name:17} {spread['median']:7.2f} [{spread['p10']:.2f}, {spread['p90']:.2f}]")
    for name in ("chat_minus_direct_ms", "responses_minus_direct_ms"):
        spread = hop[name]
        print(f"  {name:26} {spread['median']:7.2f} [{spread['p10']:.2f}, {spread['p90']:.2f}]")
    t = report["throughput"]
    print(
        f"\nthroughput: {t['rounds']} rounds x {t['n']} episodes at concurrency {t['concurrency']} "
        f"(load {t['load'][0]:.1f}-{t['load'][1]:.1f})"
    )
    for name, spread in t["episodes_per_s"].items():
        print(f"  {name:7} {spread['median']:7.1f} episodes/s [{spread['p10']:.1f}, {spread['p90']:.1f}]")
    ratio = t["ratio_routed_over_loop"]
    print(f"  routed/loop {ratio['median']:.2f} [{ratio['p10']:.2f}, {ratio['p90']:.2f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="hop: rounds of blocks")
    parser.add_argument("--calls", type=int, default=50, help="hop: calls per block")
    parser.add_argument("--throughput-rounds", type=int, default=4)
    parser.add_argument("--n", type=int, default=64, help="throughput: episodes per block")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="a tiny run that checks the bench still works")
    parser.add_argument("--out", type=Path, default=BENCH / "reports" / "routing_bench.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.calls, args.throughput_rounds, args.n, args.concurrency = 2, 3, 2, 4, 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still stops its servers
    venv = ensure_gym_venv()
    folder = Path(tempfile.mkdtemp(prefix="routing-bench-"))
    example = venv.site_packages / "resources_servers" / ENV / "data" / "example.jsonl"
    row = tagged(json.loads(example.read_text().splitlines()[0]), SCRIPT)
    context = mp.get_context("spawn")
    port_out, stop = context.Queue(), context.Event()
    process = context.Process(target=_serve_policy, args=(port_out, stop, _turns(row)), daemon=True)
    process.start()
    policy = f"http://127.0.0.1:{port_out.get(timeout=60)}"
    servers = EnvironmentServers(
        venv,
        plan([ENV], routed=True),
        state_dir=folder,
        progress=BuildLines("routing-bench"),
        extra_env={"HF_HUB_OFFLINE": "1"},
        session_servers=[policy.removeprefix("http://")],
    )
    try:
        servers.start()
        report = asyncio.run(_measure(args, servers, policy, row))
    finally:
        servers.stop(timeout=3.0)
        stop.set()
        process.join(10)
        shutil.rmtree(folder, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    _print(report)


if __name__ == "__main__":
    main()
