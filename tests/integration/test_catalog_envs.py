"""More of NeMo-Gym's catalog end to end, cheaply: every environment of ``SERVED_TOGETHER``
served by ONE ``miles-nemogym serve --no-swe --env ...`` start (nemo-gym composes their configs
into one), each one's first example row (``examples --env NAME``, the rows the wheel ships)
played through ``agent.run`` with a scripted gold answer (reward 1.0) and a wrong one (0.0)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym import agent
from miles_nemogym.cli.main import app
from tests.support.catalog_scripts import JUDGED_TOGETHER, SERVED_TOGETHER, scripts, tagged
from tests.support.judge_model import JudgeModel
from tests.support.scripted_chat import ScriptedChat
from tests.support.serve_process import serving_environments
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``NEMO_GYM_ENVS`` as the one ``serve`` start printed it, the judged environments graded by
    the stand-in judge; stopped after the module."""
    state = tmp_path_factory.mktemp("catalog-serve")
    names = (*SERVED_TOGETHER, *JUDGED_TOGETHER)
    with serving_in_thread(JudgeModel()) as judge, serving_environments(names, state, judge.url) as envs:
        yield envs


def _first_row(env: str, folder: Path) -> dict[str, Any]:
    """``env``'s first example row as ``examples --env`` writes it."""
    out = folder / f"{env}.jsonl"
    done = CliRunner().invoke(app, ["examples", "--env", env, "--output", str(out)])
    assert done.exit_code == 0, done.output
    row: dict[str, Any] = json.loads(out.read_text().splitlines()[0])
    return row


@pytest.mark.parametrize("env", (*SERVED_TOGETHER, *JUDGED_TOGETHER))
async def test_gold_scores_one_and_wrong_scores_zero(
    env: str, served: dict[str, Any], gym_chat: ScriptedChat, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat = gym_chat
    monkeypatch.setenv("NEMO_GYM_ENVS", json.dumps({env: served[env]}))
    row = _first_row(env, tmp_path)
    for outcome, turns in scripts(env, row).items():
        name = f"catalog_{env}_{outcome}"
        chat.script(name, *turns)
        marks = {"nemogym_env": env, "nemogym_task_id": f"{env}/0"}
        out = await agent.run(
            base_url=chat.session_url(name),
            prompt=[],
            request_kwargs={"temperature": 1.0, "top_p": 1.0, "max_tokens": 512},
            metadata={**tagged(row, name), **marks},
        )
        record = out["nemogym"]
        assert (record["status"], record["environment"]) == ("ok", env), record
        assert out["reward"] == (1.0 if outcome == "gold" else 0.0), (env, outcome, out["eval_report"])
        assert record["turns"] == len(turns) == len(chat.requests(name)), record
