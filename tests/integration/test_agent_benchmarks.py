"""A benchmark played by its own agent (not ``simple_agent``), by its catalog name, end to end:
``gdp_pdf`` (agent ``gdp_pdf_agent``, graded criterion by criterion by an LLM judge).

Its config is the ``gdp_pdf`` environment's, so ``convert --env gdp_pdf=FILE`` marks its rows for
that environment and ``agent.run`` routes them to the agent's own ``/run`` (its ``NEMO_GYM_ENVS``
entry names the agent, as ``serve --env gdp_pdf`` prints it), whose model call reaches the sample's
session through the routing model. The prepared rows are written here in the form the benchmark's
``prepare.py`` writes (``responses_create_params`` and ``verifier_metadata`` with the rubric's
``criteria``), without a ``document_manifest``: the agent then sends the task as text, so a text
policy answers (the real rows' rendered pages need a vision-language policy). The session is a
loopback Miles session server answering a fixed turn; the judge is the stand-in of
``tests/support/judge_model.py``, answering gdp_pdf's rubric prompt in its JSON form."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.agent import run_with_settings
from miles_nemogym.cli.main import app
from miles_nemogym.episode.record import ENV_KEY
from miles_nemogym.gym.composition import Judge
from miles_nemogym.gym.environments import EnvironmentServers, plan
from miles_nemogym.gym.venv import BuildLines, ensure_gym_venv
from miles_nemogym.settings import Settings
from miles_nemogym.transport import close_pools
from tests.support.hostile_session import SESSION_SERVERS, Act, HostileSession, turn
from tests.support.judge_model import JudgeModel
from tests.support.routed_agents import ROUTED_BENCHMARKS

pytestmark = pytest.mark.integration

[BENCHMARK] = ROUTED_BENCHMARKS
TASK = "From the filing, what is the total of the two invoices?"
CRITERION = "The total is 42 dollars"


@pytest.fixture(scope="module")
def servers(judge: JudgeModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvironmentServers]:
    """The environment that plays the benchmark, as ``serve --env gdp_pdf --judge-url ...`` starts it."""
    venv = ensure_gym_venv(progress=lambda line: print(f"[gym-venv] {line}", file=sys.__stderr__, flush=True))
    started = EnvironmentServers(
        venv,
        plan([BENCHMARK]),
        state_dir=tmp_path_factory.mktemp("agent-benchmarks"),
        progress=BuildLines("agent-benchmarks"),
        extra_env={"HF_HUB_OFFLINE": "1"},
        judge=Judge(url=judge.url, model="judge"),
        session_servers=SESSION_SERVERS,
    )
    try:
        started.start()
        yield started
    finally:
        started.stop(timeout=3.0)


def _prepared(folder: Path) -> Path:
    """Two rows as ``benchmarks/gdp_pdf/prepare.py`` writes them: the task and its rubric."""
    path = folder / "gdp_pdf_prepared.jsonl"
    rows = [
        {
            "responses_create_params": {"input": [{"role": "user", "content": TASK}]},
            "verifier_metadata": {"prompt": TASK, "criteria": [{"index": 0, "criterion": CRITERION}], "id": f"t{n}"},
        }
        for n in range(2)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _converted(tmp_path: Path) -> list[dict[str, Any]]:
    out = tmp_path / "rows.jsonl"
    done = CliRunner().invoke(app, ["convert", "--env", f"{BENCHMARK}={_prepared(tmp_path)}", "-o", str(out), "-q"])
    assert done.exit_code == 0, done.output
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_the_benchmark_converts_by_name_for_the_environment_whose_agent_plays_it(tmp_path: Path) -> None:
    rows = _converted(tmp_path)
    assert len(rows) == 2
    mark = rows[0]["metadata"]["nemogym_benchmark"]
    assert mark == {
        "name": BENCHMARK,
        "environment": BENCHMARK,
        "num_repeats": 5,
        "reward_range": [0.0, 1.0],
        "higher_is_better": True,
    }
    assert rows[0]["metadata"][ENV_KEY] == BENCHMARK
    assert rows[0]["prompt"] == [{"role": "user", "content": TASK}]


def test_its_rows_are_played_by_its_agents_run_and_graded_by_its_judge(
    servers: EnvironmentServers, judge: JudgeModel, tmp_path: Path
) -> None:
    entry = json.loads(servers.setting())[BENCHMARK]
    assert set(entry) >= {"url", "agent"}  # routed: the row goes to the agent's own /run
    settings = Settings.from_env().with_overrides(
        environments_text=servers.setting(), rollout_secret=servers.rollout_secret
    )
    gold, wrong = _converted(tmp_path)
    with HostileSession().running() as session:
        answers = [
            (gold, session.session_url(Act(body=turn(f"{CRITERION}, from both invoices."))), 1.0),
            (wrong, session.session_url(Act(body=turn("The total is 41 dollars."))), 0.0),
        ]

        async def play() -> list[dict[str, Any]]:
            try:
                return [
                    await run_with_settings(settings, base_url=url, metadata=row["metadata"]) for row, url, _ in answers
                ]
            finally:
                await close_pools()

        outs = asyncio.run(play())
        for (_, url, reward), out in zip(answers, outs, strict=True):
            assert out["nemogym"]["status"] == "ok", out["nemogym"]
            assert out["reward"] == reward, out
            assert session.count(url.rsplit("/", 1)[1]) == 1  # one policy call, on this sample's own session
    graded = [str(r["messages"][-1]["content"]) for r in judge.requests]
    assert any(f"response: {CRITERION}, from both invoices." in p for p in graded), graded
    assert any("response: The total is 41 dollars." in p for p in graded), graded
