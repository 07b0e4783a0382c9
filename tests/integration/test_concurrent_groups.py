"""GRPO groups over the real server: n episodes of one task at once, round after round.

nemo-gym 0.7.0 rewrites one config file per instance on every ``/run`` and the run's Ray
task reads it back later; unpatched, a concurrent episode of the same instance can find it
truncated (the episode crashes, ``'NoneType' object has no attribute 'get'``) or holding
another episode's sampling parameters. The server environment carries this package's fix
(docs/upstream.md, "Patched"); this test runs whole groups of the recipe's size, each
episode with its own seed as Miles gives one per sample, and counts what went wrong.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
import yaml

from miles_nemogym.gym.server import GymServer
from miles_nemogym.smoke._policy import RecordingPolicy
from tests.integration.test_gym_server import run_body

pytestmark = pytest.mark.integration

INSTANCE = "sympy__sympy-20916"
GROUP = 8  # the recipe's n_samples_per_prompt
ROUNDS = 3


def _group_body(rows: list[dict[str, Any]], policy: RecordingPolicy, session: str, seed: int) -> dict[str, Any]:
    body = run_body(rows, INSTANCE, policy.session_url(session))
    body["responses_create_params"]["metadata"] = {"extra_body": json.dumps({"seed": seed})}
    return body


async def _answer(gym_server: GymServer, body: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session,
        session.post(f"{gym_server.url}/run", json=body) as response,
    ):
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


async def test_whole_groups_of_one_task_run_at_once_without_a_crash_or_a_foreign_config(
    gym_server: GymServer, recording_policy: RecordingPolicy, gym_example_rows: list[dict[str, Any]]
) -> None:
    crashed: list[str] = []
    other: list[str] = []
    foreign: list[str] = []
    started = time.monotonic()
    for round_ in range(ROUNDS):
        sessions = {f"group-{round_}-{k}": 1000 * round_ + k for k in range(GROUP)}
        answers = await asyncio.gather(
            *(
                _answer(gym_server, _group_body(gym_example_rows, recording_policy, session, seed))
                for session, seed in sessions.items()
            )
        )
        for result, (session, seed) in zip(answers, sessions.items(), strict=True):
            if "error" in result["metadata"]:
                error = str(result["metadata"]["error"]).strip()
                # The race's crash: the config file read back empty (yaml gives None).
                race = "'NoneType' object has no attribute" in error or "sandbox.yaml" in error
                (crashed if race else other).append(f"{session}: {error.splitlines()[-1] if error else '?'}")
                continue
            seeds = {request.body.get("seed") for request in recording_policy.chat_requests(session)}
            if seeds != {seed}:
                foreign.append(f"{session}: sent seed {seed}, the policy saw {sorted(map(str, seeds))}")
    summary = (
        f"{ROUNDS} rounds of {GROUP} concurrent {INSTANCE} episodes in {time.monotonic() - started:.0f} s: "
        f"{len(crashed)} crashed on the config file, {len(foreign)} ran with another episode's seed, "
        f"{len(other)} failed otherwise"
    )
    print(summary)
    assert not crashed and not foreign, "\n".join([summary, *crashed, *foreign])
    # Another failure (a command timing out on a loaded machine) is not this race, but the
    # seeds are checked only on episodes that ran: most of them must have.
    assert len(other) <= ROUNDS * GROUP // 4, "\n".join([summary, *other])

    # Each distinct config has its own file, none is named for the instance alone (other
    # tests run this instance too, with other parameters).
    configs = gym_server.results_dir / "verified" / "policy" / "_configs"
    mine = sorted(configs.glob(f"{INSTANCE}.*"))
    assert f"{INSTANCE}.sandbox.yaml" not in [path.name for path in mine]
    sent = {seed for round_ in range(ROUNDS) for seed in range(1000 * round_, 1000 * round_ + GROUP)}
    written = [_seed(yaml.safe_load(path.read_text())) for path in mine]
    # Every episode's own config is on disk (other tests may have written the same seed with
    # another policy URL: a config of their own, in a file of its own).
    assert sent <= set(written), sorted(sent - set(written))


def _seed(config: dict[str, Any]) -> Any:
    return config.get("model", {}).get("model_kwargs", {}).get("extra_body", {}).get("seed")
