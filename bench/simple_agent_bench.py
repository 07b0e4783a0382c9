"""This package's ``simple_agent`` loop vs NeMo-Gym's own ``simple_agent`` ``/run``, side by side.

One instant scripted policy (its own process) and two resources servers, each registered in
one composed NeMo-Gym config with its own ``simple_agent`` (``max_steps`` 6) in front of the
same ``vllm_model``:

  real      the real ``workplace_assistant`` server (0.7.0, from the cached server venv);
  stand_in  ``bench/stand_in_resources/app.py``: the same contract (``/seed_session`` with a
            cookie, ``POST /<tool>``, ``/verify`` answering ``reward``) with minimal work, so
            the client's own cost is not hidden behind the server's.

The episode is the same on both: search an email, reply to it, answer (3 model turns,
2 tool calls, seed and verify; reward 1.0). Clients:

  a  this package's loop as the agent function runs it: ``episode.environment.prepare`` then
     ``runtime.deliver`` (abortable, behind its server's circuit, the loop's pool);
  b  ``POST /run`` to NeMo-Gym's ``simple_agent`` (which calls the policy through its
     ``vllm_model`` server), the upstream reference;
  c  the same HTTP requests with nothing around them (one ``aiohttp`` session, the cookie
     passed by hand, the row and the chat bodies' fixed part prepared once, the ``/verify``
     body taken from a probe episode): the floor for (a).

Two measurements, blocks of clients alternating (ABAB, the order flipped every round):

  overhead    on ``stand_in``, one episode at a time: per model turn, (a) - (c) in wall time
              and in this process's CPU time, paired per round; goal <= 1 ms.
  throughput  on both servers (``--n`` episodes at ``--concurrency`` on ``stand_in``, ``--real-n``
              at ``--real-concurrency`` on ``real``, ~0.1 s of server CPU each): episodes/s of a, b, c,
              the ratio a/b per round (goal >= 1.0), CPU per episode of this process and of
              every process of the run (policy, servers, ``simple_agent``, ``vllm_model``).

Every figure carries the 1-minute load average of the blocks it comes from (the machine is
shared). ``--profile`` adds a cProfile of client (a) on ``stand_in``.

    python bench/simple_agent_bench.py [--quick] [--out bench/reports/simple_agent_bench.json]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import multiprocessing as mp
import os
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pydantic_core
import yaml

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from miles_nemogym.episode import environment  # noqa: E402
from miles_nemogym.episode.record import Outcome, Task  # noqa: E402
from miles_nemogym.gym.venv import ensure_gym_venv  # noqa: E402
from miles_nemogym.runtime import current, deliver  # noqa: E402
from miles_nemogym.settings import EnvironmentServer, Settings  # noqa: E402
from miles_nemogym.transport import close_pools  # noqa: E402
from tests.support.gym_envs import GymEnvironments  # noqa: E402
from tests.support.scripted_chat import ScriptedChat, Turn, tagged, tool  # noqa: E402

ENV = "workplace_assistant"
STAND_IN = "stand_in_resources"
SERVERS = {"real": ENV, "stand_in": STAND_IN}
SCRIPT = "bench"
TURNS = 3
_JSON = {"Content-Type": "application/json"}
_STAND_IN_CONFIG = {
    STAND_IN: {"resources_servers": {STAND_IN: {"entrypoint": "app.py", "domain": "other"}}},
    f"{STAND_IN}_simple_agent": {
        "responses_api_agents": {
            "simple_agent": {
                "entrypoint": "app.py",
                "max_steps": 6,
                "resources_server": {"type": "resources_servers", "name": STAND_IN},
                "model_server": {"type": "responses_api_models", "name": "policy_model"},
            }
        }
    },
}

Client = Callable[[], Awaitable[None]]


def _stand_in(state: Path) -> dict[str, tuple[Path, Path]]:
    """The stand-in as ``GymEnvironments`` takes it: its config file (written here) and app folder."""
    config = state / f"{STAND_IN}.yaml"
    config.write_text(yaml.safe_dump(_STAND_IN_CONFIG))
    return {STAND_IN: (config, BENCH / STAND_IN)}


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


def _tree_cpu() -> float:
    """CPU seconds of this process and every process under it (Linux ``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / ticks
    ours = {os.getpid()}
    grew = True
    while grew:
        found = {pid for pid, ppid in parent.items() if ppid in ours} - ours
        grew = bool(found)
        ours |= found
    return sum(cpu.get(pid, 0.0) for pid in ours)


async def _block(n: int, concurrency: int, one: Client) -> dict[str, float]:
    """``n`` episodes, at most ``concurrency`` at once: wall, this process's CPU, the tree's CPU."""
    semaphore = asyncio.Semaphore(concurrency)

    async def guarded() -> None:
        async with semaphore:
            await one()

    load = os.getloadavg()[0]
    tree, cpu, wall = _tree_cpu(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(guarded() for _ in range(n)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"  {n} episodes at concurrency {concurrency}: {wall:.2f} s", file=sys.stderr, flush=True)
    return {"wall": wall, "cpu": cpu, "tree_cpu": _tree_cpu() - tree, "load": max(load, os.getloadavg()[0])}


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    cut = len(ordered) // 10
    return {
        "median": statistics.median(ordered),
        "p10": ordered[cut],
        "p90": ordered[-1 - cut],
        "min": ordered[0],
        "max": ordered[-1],
    }


def _load(blocks: list[dict[str, float]]) -> list[float]:
    return [min(b["load"] for b in blocks), max(b["load"] for b in blocks)]


class _Clients:
    """Clients a, b, c for one server, after a probe episode of each checked reward 1.0."""

    def __init__(self, envs: GymEnvironments, env: str, policy: str, row: dict[str, Any], http: Any) -> None:
        self.resources = envs.resources_url(env)
        self.agent = envs.agent_url(env)
        self.policy = policy
        self.row = row
        self.http: aiohttp.ClientSession = http
        self.env = env
        self.settings = Settings.from_env({})
        self.server = EnvironmentServer(url=self.resources, max_steps=6)
        self.messages, self.first_body = environment.first_request(row["responses_create_params"], None)
        self.row_bytes = pydantic_core.to_json(row)
        self.verify_bytes = b""

    async def __aenter__(self) -> _Clients:
        probe = await self._episode()
        assert isinstance(probe.answer, dict), probe
        self.verify_bytes = pydantic_core.to_json({**self.row, "response": probe.answer["response"]})
        for client in (self.a, self.b, self.c):
            await client()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await close_pools()

    async def _episode(self) -> Outcome:
        episode = environment.prepare(
            Task.of(self.row, self.env),
            self.server,
            session_url=f"{self.policy}/sessions/a",
            request_kwargs=None,
            settings=self.settings,
        )
        outcome = await deliver(episode, self.settings, current().circuits, current().in_flight)
        assert outcome.reward == 1.0 and outcome.record.turns == TURNS, outcome.record
        return outcome

    async def a(self) -> None:
        await self._episode()

    async def b(self) -> None:
        async with self.http.post(f"{self.agent}/run", data=self.row_bytes, headers=_JSON) as r:
            assert r.status == 200 and json.loads(await r.read())["reward"] == 1.0

    async def c(self) -> None:
        http, resources = self.http, self.resources
        async with http.post(f"{resources}/seed_session", data=self.row_bytes, headers=_JSON) as r:
            await r.read()
            cookie = "; ".join(f"{key}={morsel.value}" for key, morsel in r.cookies.items())
        with_cookie = {**_JSON, "Cookie": cookie}
        messages = list(self.messages)
        while True:
            body = pydantic_core.to_json({**self.first_body, "messages": messages})
            async with http.post(f"{self.policy}/sessions/c/v1/chat/completions", data=body, headers=_JSON) as r:
                message = json.loads(await r.read())["choices"][0]["message"]
            messages.append(message)
            calls = message.get("tool_calls")
            if not calls:
                break
            for call in calls:
                url, arguments = f"{resources}/{call['function']['name']}", call["function"]["arguments"]
                async with http.post(url, data=arguments.encode(), headers=with_cookie) as r:
                    assert r.status == 200, (url, r.status, await r.read())  # the cookie reached the server
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": (await r.read()).decode()})
        async with http.post(f"{resources}/verify", data=self.verify_bytes, headers=with_cookie) as r:
            assert json.loads(await r.read())["reward"] == 1.0


async def _overhead(clients: _Clients, rounds: int, episodes: int) -> dict[str, Any]:
    """(a) - (c) per turn, one episode at a time, blocks alternating a c / c a."""
    blocks: dict[str, list[dict[str, float]]] = {"a": [], "c": []}
    for index in range(rounds):
        for name in ("a", "c") if index % 2 == 0 else ("c", "a"):
            blocks[name].append(await _block(episodes, 1, getattr(clients, name)))
    per_turn = episodes * TURNS
    result: dict[str, Any] = {
        "rounds": rounds,
        "episodes_per_block": episodes,
        "load": _load(blocks["a"] + blocks["c"]),
    }
    for measure in ("wall", "cpu"):
        diffs = [(a[measure] - c[measure]) / per_turn * 1000 for a, c in zip(blocks["a"], blocks["c"], strict=True)]
        result[f"{measure}_ms_per_turn"] = {
            "a": _spread([b[measure] / per_turn * 1000 for b in blocks["a"]]),
            "c": _spread([b[measure] / per_turn * 1000 for b in blocks["c"]]),
            "a_minus_c": _spread(diffs),
        }
    return result


async def _throughput(clients: _Clients, rounds: int, n: int, concurrency: int) -> dict[str, Any]:
    """Episodes/s of a, b, c at ``concurrency``; the order rotates every round."""
    names = ["a", "b", "c"]
    blocks: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names[index % 3 :] + names[: index % 3]:
            blocks[name].append(await _block(n, concurrency, getattr(clients, name)))
    rate = {name: [n / b["wall"] for b in blocks[name]] for name in names}
    return {
        "rounds": rounds,
        "n": n,
        "concurrency": concurrency,
        "load": _load([b for name in names for b in blocks[name]]),
        "episodes_per_s": {name: _spread(rate[name]) for name in names},
        "ratio_a_over_b": _spread([a / b for a, b in zip(rate["a"], rate["b"], strict=True)]),
        "ratio_a_over_c": _spread([a / c for a, c in zip(rate["a"], rate["c"], strict=True)]),
        "client_cpu_ms_per_episode": {name: _spread([b["cpu"] / n * 1000 for b in blocks[name]]) for name in names},
        "all_processes_cpu_ms_per_episode": {
            name: _spread([b["tree_cpu"] / n * 1000 for b in blocks[name]]) for name in names
        },
    }


async def _profile(clients: _Clients, episodes: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(episodes):
        await clients.a()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    return out.getvalue()


async def _measure(args: argparse.Namespace, envs: GymEnvironments, policy: str, row: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "turns_per_episode": TURNS,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=None)
    ) as http:
        for server in args.servers:
            print(f"{server}:", file=sys.stderr, flush=True)
            async with _Clients(envs, SERVERS[server], policy, row, http) as clients:
                if server == "stand_in":
                    report["overhead"] = await _overhead(clients, args.rounds, args.episodes)
                    if args.profile:
                        report["profile"] = await _profile(clients, args.profile)
                report.setdefault("throughput", {})[server] = await _throughput(
                    clients,
                    args.throughput_rounds,
                    args.real_n if server == "real" else args.n,
                    args.real_concurrency if server == "real" else args.concurrency,
                )
            args.out.write_text(json.dumps(report, indent=2))  # each server's figures as soon as taken
    return report


def _print(report: dict[str, Any]) -> None:
    if "overhead" in report:
        o = report["overhead"]
        print(
            f"\noverhead on stand_in, one episode at a time ({o['rounds']} rounds x {o['episodes_per_block']} "
            f"episodes, load {o['load'][0]:.1f}-{o['load'][1]:.1f}), ms per turn: median [p10, p90]"
        )
        for measure in ("wall", "cpu"):
            row = o[f"{measure}_ms_per_turn"]
            cells = "  ".join(f"{k} {v['median']:.3f} [{v['p10']:.3f}, {v['p90']:.3f}]" for k, v in row.items())
            print(f"  {measure:4}  {cells}")
    for server, t in report.get("throughput", {}).items():
        print(
            f"\nthroughput on {server}: {t['rounds']} rounds x {t['n']} episodes at concurrency "
            f"{t['concurrency']} (load {t['load'][0]:.1f}-{t['load'][1]:.1f})"
        )
        for name in ("a", "b", "c"):
            print(
                f"  {name}  {t['episodes_per_s'][name]['median']:8.1f} episodes/s   client CPU "
                f"{t['client_cpu_ms_per_episode'][name]['median']:6.2f} ms/episode   all processes "
                f"{t['all_processes_cpu_ms_per_episode'][name]['median']:6.2f} ms/episode"
            )
        r = t["ratio_a_over_b"]
        print(f"  a/b {r['median']:.2f} [{r['min']:.2f}, {r['max']:.2f}]   a/c {t['ratio_a_over_c']['median']:.2f}")
    if "profile" in report:
        print("\n" + report["profile"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="overhead: rounds of (a, c) blocks")
    parser.add_argument("--episodes", type=int, default=20, help="overhead: episodes per block")
    parser.add_argument("--throughput-rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=300, help="throughput on stand_in: episodes per block")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--real-n", type=int, default=64, help="throughput on real: episodes per block")
    parser.add_argument("--real-concurrency", type=int, default=16)
    parser.add_argument("--servers", nargs="+", choices=sorted(SERVERS), default=["stand_in", "real"])
    parser.add_argument("--profile", type=int, default=0, metavar="EPISODES", help="cProfile (a) on stand_in")
    parser.add_argument("--quick", action="store_true", help="a tiny run that checks the bench still works")
    parser.add_argument("--out", type=Path, default=BENCH / "reports" / "simple_agent_bench.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.episodes, args.throughput_rounds = 2, 2, 1
        args.n = args.real_n = 6
        args.concurrency = args.real_concurrency = 3
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still stops its servers
    venv = ensure_gym_venv()
    state = Path(tempfile.mkdtemp(prefix="sa-bench-"))
    row = tagged(GymEnvironments(venv, [ENV], "", state).example_rows(ENV)[0], SCRIPT)
    context = mp.get_context("spawn")
    port_out, stop = context.Queue(), context.Event()
    process = context.Process(target=_serve_policy, args=(port_out, stop, _turns(row)), daemon=True)
    process.start()
    policy = f"http://127.0.0.1:{port_out.get(timeout=60)}"
    envs = GymEnvironments(venv, [ENV], f"{policy}/v1", state, stand_ins=_stand_in(state))
    envs.start()
    try:
        report = asyncio.run(_measure(args, envs, policy, row))
    finally:
        envs.stop()
        stop.set()
        process.join(10)
        shutil.rmtree(state, ignore_errors=True)
    _print(report)


if __name__ == "__main__":
    main()
