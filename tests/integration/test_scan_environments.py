"""``miles-nemogym scan`` on environment rows, against the real resources servers of the session:
golden (each row's gold passes, its wrong answer does not) on three environments, an API-policy
scan (the key sent to the policy alone, pass rate and time per environment), ``--resume``, and
the gate that names ``serve --env`` for an environment ``NEMO_GYM_ENVS`` lacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.data._environments import task_key, to_environment_row
from miles_nemogym.gym.environments import plan, setting
from miles_nemogym.smoke._answers import PLAIN_ANSWER
from miles_nemogym.smoke._policy import RecordingPolicy
from tests.support.environment_rows import shipped_rows
from tests.support.golden_scan import read_results
from tests.support.gym_envs import GymEnvironments
from tests.support.prompt_rows import write_jsonl

pytestmark = pytest.mark.integration

GRADED = ("mcqa", "workplace_assistant", "xlam_fc")
ROWS = 3
KEY = "sk-scan-environments-0123456789"


def _rows(tmp_path: Path) -> Path:
    """``ROWS`` shipped rows of each environment, as ``convert --env`` writes them."""
    rows: list[Any] = []
    for name in GRADED:
        for index, raw in enumerate(shipped_rows(name)[:ROWS]):
            rows.append(to_environment_row(raw, name, f"{name}/{task_key(raw, index)}"))
    return write_jsonl(tmp_path / "rows.jsonl", rows)


@pytest.fixture
def session_envs_set(gym_environments: GymEnvironments, monkeypatch: pytest.MonkeyPatch) -> None:
    """``NEMO_GYM_ENVS`` as ``serve --env`` prints it for the session's servers."""
    urls = {name: gym_environments.resources_url(name) for name in GRADED}
    monkeypatch.setenv("NEMO_GYM_ENVS", setting(plan(list(GRADED)), urls, {}))
    monkeypatch.delenv("NEMO_GYM_POLICY_API_KEY", raising=False)
    monkeypatch.setenv("COLUMNS", "80")


def _scan(*args: str) -> Any:
    return CliRunner().invoke(app, ["scan", *args])


@pytest.mark.timeout(600)
def test_a_golden_scan_passes_each_gold_answer_and_fails_each_wrong_one(session_envs_set: None, tmp_path: Path) -> None:
    rows, results = _rows(tmp_path), tmp_path / "results.jsonl"

    done = _scan("--input", str(rows), "--golden", "--output", str(results))

    assert done.exit_code == 0, done.output
    lines = read_results(results)
    assert len(lines) == ROWS * len(GRADED)
    for line in lines.values():
        assert (line.verdict.value, line.reward, line.wrong_reward) == ("passed", 1.0, 0.0), line
        assert line.mode == "golden" and line.environment == line.instance_id.split("/")[0]
        assert line.nemogym["mask_sample"] is False and line.nemogym["environment"] == line.environment
    for name in GRADED:
        assert f"│ {name} " in done.output  # a row of the summary per environment
        assert f"PASS  {name}/" in done.output
    assert "reward 1.0 (wrong 0.0)" in done.output
    assert "┃ environment " in done.output


@pytest.mark.timeout(600)
def test_an_api_policy_scan_reports_per_environment_and_resumes(
    session_envs_set: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, results = _rows(tmp_path), tmp_path / "results.jsonl"
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", KEY)
    with RecordingPolicy(look_around_turns=0) as policy:
        # An OpenAI-compatible API at .../v1: the scripted policy's one session stands in for a model
        # that answers text without a tool call, so every row is graded and none passes.
        policy.configure_session("api", answers=PLAIN_ANSWER)
        api = f"{policy.session_url('api')}/v1"
        first = _scan("--input", str(rows), "--policy-base-url", api, "--output", str(results), "--limit", "4")
        assert first.exit_code == 1, first.output  # graded, not passed: a model that fails, not a broken server
        assert len(read_results(results)) == 4

        rest = _scan(
            "--input", str(rows), "--policy-base-url", api, "--output", str(results), "--resume", "--allow-unresolved"
        )
        assert rest.exit_code == 0, rest.output
        assert "resuming: 4 of 9 instances already in" in rest.output
        chats = policy.chat_requests("api")

    lines = read_results(results)
    assert len(lines) == ROWS * len(GRADED)
    for line in lines.values():
        assert (line.verdict.value, line.failure_kind, line.mode) == ("failed", "failed", "policy"), line
        assert line.reason == f"{line.environment}'s verifier scored 0.0"  # store.views.reward_text
        assert line.wrong_reward is None and line.seconds > 0
    assert len(chats) == ROWS * len(GRADED)  # one model call per row: each run once, across the two scans
    assert all(chat.authorization == f"Bearer {KEY}" for chat in chats)
    assert KEY not in results.read_text() and KEY not in rest.output
    for name in GRADED:
        assert any(
            line.startswith(f"│ {name} ") and "│         3 │      0 │" in line for line in rest.output.splitlines()
        )
        assert f"{name}: not passed, by kind: failed 3" in rest.output.splitlines()


def test_an_environment_missing_from_nemo_gym_envs_stops_the_scan_naming_serve(
    session_envs_set: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _rows(tmp_path)
    monkeypatch.setenv("NEMO_GYM_ENVS", json.dumps({"mcqa": "http://127.0.0.1:9"}))

    done = _scan("--input", str(rows), "--golden")

    assert done.exit_code == 2, done.output
    said = " ".join(done.output.split())
    assert "workplace_assistant, xlam_fc are not in NEMO_GYM_ENVS (it names mcqa)" in said
    assert "miles-nemogym serve --env workplace_assistant --env xlam_fc" in said
