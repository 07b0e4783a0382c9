"""This package's ``simple_agent`` loop vs NeMo-Gym's own ``simple_agent`` ``/run``, side by side.

Same real ``workplace_assistant`` resources server (0.7.0, from the cached server venv),
same instant scripted policy (its own process), same episode: search an email, reply to
it, answer (3 model turns, 2 tool calls, seed and verify). Clients, alternating in one run:

  a  ``miles_nemogym.simple_agent.run_episode`` with one shared ``Connections``;
  b  ``POST /run`` to NeMo-Gym's ``simple_agent`` (which calls its ``vllm_model`` server,
     in front of the same policy), the upstream reference;
  c  the bare HTTP calls of the same episode (seed, 3 chats, 2 tools, verify) with
     precomputed bodies on one ``aiohttp`` session: the floor for (a).

Reports episodes/s at concurrency C for each, the ratio a/b (goal >= 1.0), and the loop's
overhead per turn over the bare calls, (a - c) / turns at concurrency 1 (goal <= 1 ms).

    python bench/simple_agent_bench.py [--n 200] [--concurrency 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from miles_nemogym.gym.venv import ensure_gym_venv  # noqa: E402
from miles_nemogym.simple_agent import Connections, EpisodeResult, Limits, run_episode  # noqa: E402
from tests.support.gym_envs import GymEnvironments  # noqa: E402
from tests.support.scripted_chat import ScriptedChat, Turn, tagged, tool  # noqa: E402

ENV = "workplace_assistant"
SCRIPT = "bench"


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


async def _bare(
    session: aiohttp.ClientSession, row: dict[str, Any], verify_body: dict[str, Any], policy: str, resources: str
) -> None:
    """The episode's HTTP calls with nothing around them: seed, chat until no tool call, verify."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as own:
        async with own.post(f"{resources}/seed_session", json=row) as r:
            await r.read()
        messages: list[dict[str, Any]] = list(row["responses_create_params"]["input"])
        while True:
            async with session.post(f"{policy}/sessions/x/v1/chat/completions", json={"messages": messages}) as r:
                message = (await r.json())["choices"][0]["message"]
            messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                name, arguments = call["function"]["name"], call["function"]["arguments"]
                async with own.post(f"{resources}/{name}", json=json.loads(arguments)) as r:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": await r.text()})
        async with own.post(f"{resources}/verify", json=verify_body) as r:
            await r.read()


async def _timed(n: int, concurrency: int, one: Callable[[], Awaitable[None]]) -> float:
    semaphore = asyncio.Semaphore(concurrency)

    async def guarded() -> None:
        async with semaphore:
            await one()

    started = time.perf_counter()
    await asyncio.gather(*(guarded() for _ in range(n)))
    return time.perf_counter() - started


async def _measure(args: argparse.Namespace, envs: GymEnvironments, policy: str) -> dict[str, Any]:
    row = tagged(envs.example_rows(ENV)[0], SCRIPT)
    limits = Limits(max_steps=6)
    async with Connections() as connections, aiohttp.ClientSession() as session:

        async def episode() -> EpisodeResult:
            return await run_episode(
                row,
                session_url=f"{policy}/sessions/x",
                resources_url=envs.resources_url(ENV),
                limits=limits,
                connections=connections,
            )

        probe = await episode()
        assert probe.reward == 1.0 and probe.verify is not None, probe
        verify_body = {**row, "response": probe.verify["response"]}

        async def ours() -> None:
            result = await episode()
            assert result.reward == 1.0, result

        async def theirs() -> None:
            async with session.post(f"{envs.agent_url(ENV)}/run", json=row) as r:
                assert r.status == 200 and (await r.json())["reward"] == 1.0

        async def bare() -> None:
            await _bare(session, row, verify_body, policy, envs.resources_url(ENV))

        clients = {"a": ours, "b": theirs, "c": bare}
        for one in clients.values():  # warm-up
            await _timed(8, 4, one)
        rates: dict[str, list[float]] = {k: [] for k in clients}
        latency: dict[str, list[float]] = {k: [] for k in clients}
        for _ in range(args.repeats):
            for name, one in clients.items():
                rates[name].append(args.n / await _timed(args.n, args.concurrency, one))
                latency[name].append(await _timed(args.serial, 1, one) / args.serial)
    med = {k: statistics.median(v) for k, v in rates.items()}
    lat = {k: statistics.median(v) for k, v in latency.items()}
    return {
        "episodes_per_s": med,
        "ratio_a_over_b": med["a"] / med["b"],
        "latency_ms": {k: v * 1000 for k, v in lat.items()},
        "overhead_per_turn_ms": (lat["a"] - lat["c"]) * 1000 / 3,
        "args": vars(args),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--serial", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    venv = ensure_gym_venv()
    rows_dir = Path(tempfile.mkdtemp(prefix="sa-bench-"))
    context = mp.get_context("spawn")
    port_out, stop = context.Queue(), context.Event()
    probe_rows = GymEnvironments(venv, [ENV], "", rows_dir).example_rows(ENV)
    process = context.Process(target=_serve_policy, args=(port_out, stop, _turns(probe_rows[0])), daemon=True)
    process.start()
    policy = f"http://127.0.0.1:{port_out.get(timeout=60)}"
    envs = GymEnvironments(venv, [ENV], f"{policy}/v1", rows_dir)
    envs.start()
    try:
        report = asyncio.run(_measure(args, envs, policy))
    finally:
        envs.stop()
        stop.set()
        process.join(10)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
