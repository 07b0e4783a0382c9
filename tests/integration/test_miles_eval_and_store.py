"""Held-out eval and the episode store under Miles' own rollout step (pinned commit, CPU).

Each test runs Miles' real train or eval step through ``tests/support/miles_harness.py``
with the launcher's own eval wiring (``launcher._command.eval_args``: the inline
``--eval-config`` whose ``metadata_overrides`` mark eval samples, ``--log-passrate``,
``log_eval``) and ``NEMO_GYM_EPISODE_DIR`` set; then reads what reached Miles' tracking
and what the store holds on disk.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.gym.server import GymServer
from miles_nemogym.launcher._command import eval_args
from miles_nemogym.launcher._config import LauncherConfig
from miles_nemogym.store.views import load
from tests.support.fault_server import FaultServer
from tests.support.miles_harness import MilesDriver
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.integration

SYMPY, SKLEARN, PYLINT = "sympy__sympy-20916", "scikit-learn__scikit-learn-14141", "pylint-dev__pylint-4551"
SPHINX = "sphinx-doc__sphinx-8595"
FAST_ENV = {"NEMO_GYM_RUN_TIMEOUT": "600"}
E = "nemogym-eval/swe/"


def _eval_data(folder: Path, rows: list[dict[str, Any]], k: int) -> tuple[Path, list[str]]:
    """The rows as a held-out file, and the launcher's eval flags for it (set name ``swe``)."""
    path = folder / "holdout.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = LauncherConfig(eval_data=path, eval_name="swe", eval_samples_per_prompt=k, eval_interval=1)
    return path, eval_args(config)


def test_eval_step_logs_nemogym_eval_with_masked_episodes_set_aside(
    miles_driver: MilesDriver, rows: dict[str, dict[str, Any]], results: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    # SKLEARN resolves, PYLINT does not, every SYMPY episode crashes on the Gym side.
    data, flags = _eval_data(tmp_path, [rows[SKLEARN], rows[PYLINT], rows[SYMPY]], k=2)
    server = FaultServer.with_fault(results, SYMPY, "error_metadata")
    store = tmp_path / "episodes"
    with serving_in_thread(server):
        result = miles_driver.step(
            gym_url=server.url,
            data_file=data,
            n_samples=2,
            mode="eval",
            env={**FAST_ENV, "NEMO_GYM_EPISODE_DIR": str(store)},
            extra_argv=flags,
            rollout_id=7,
        ).check()

    samples = result.eval["swe"]["samples"]
    assert len(samples) == 6
    assert {(s["metadata"]["nemogym_role"], s["metadata"]["nemogym_eval_set"]) for s in samples} == {("eval", "swe")}
    assert all("nemogym_role" not in body for body in server.bodies)  # our marks never reach the Gym
    assert [c["result"] for c in result.hook_calls("eval_log")] == [False]

    tracked = result.tracked("eval/step")
    assert tracked["eval/step"] == 7
    # Miles' own average counts the two crashed episodes as wrong answers...
    assert tracked["eval/swe"] == pytest.approx(2 / 6)
    # ...ours sets them aside and says how many.
    assert tracked[E + "episodes"] == 6.0
    assert tracked[E + "episodes_valid"] == 4.0
    assert tracked[E + "episodes_masked"] == 2.0
    assert tracked[E + "masked_fraction"] == pytest.approx(2 / 6)
    assert tracked[E + "masked/agent_run_error"] == 2.0
    assert tracked[E + "pass@1"] == 0.5  # SKLEARN 2/2, PYLINT 0/2; SYMPY has no measurement
    assert tracked[E + "pass@2"] == 0.5
    assert tracked[E + "instances"] == 3.0 and tracked[E + "instances_short_of_k"] == 1.0
    assert tracked[E + "resolve_rate"] == 0.5
    assert tracked[E + "patch_applied_rate"] == 1.0
    assert tracked[E + "resolve_rate/scikit-learn__scikit-learn"] == 1.0
    assert tracked[E + "resolve_rate/pylint-dev__pylint"] == 0.0

    # Every eval episode, the crashed ones too, is in the store under step 7.
    stored = load(store, answers=True).episodes
    assert {(e.role, e.step, e.entry["eval_set"]) for e in stored} == {("eval", 7, "swe")}
    assert sorted(e.instance_id for e in stored) == sorted([SKLEARN, PYLINT, SYMPY] * 2)
    assert len({e.episode_id for e in stored}) == len({e.entry["session_id"] for e in stored}) == 6
    assert sorted(e.kind for e in stored if e.instance_id == SYMPY) == ["agent_run_error"] * 2
    # Filed under the step (compression of the step's file may still be under way).
    names = {p.name for p in (store / "eval").iterdir()}
    assert names and all(re.fullmatch(r"step-000007-[\w-]+\.(jsonl|jsonl\.gz|heads)", name) for name in names)


def test_real_train_and_eval_steps_are_stored_by_role_and_step(
    miles_driver: MilesDriver, gym_server: GymServer, rows: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    store = tmp_path / "episodes"
    env = {"NEMO_GYM_EPISODE_DIR": str(store), "NEMO_GYM_POLICY_API_KEY": "sk-store-e2e"}
    train_rows = [rows[SYMPY], rows[SPHINX]]
    train = miles_driver.step(gym_url=gym_server.url, rows=train_rows, n_samples=2, env=env, rollout_id=3).check()
    data, flags = _eval_data(tmp_path, [rows[SPHINX]], k=2)
    result = miles_driver.step(
        gym_url=gym_server.url,
        data_file=data,
        n_samples=2,
        mode="eval",
        env=env,
        extra_argv=flags,
        rollout_id=3,
    ).check()
    assert result.tracked("eval/step")[E + "episodes"] == 2.0

    stored = load(store, answers=True).episodes
    by_role = {role: [e for e in stored if e.role == role] for role in ("train", "eval")}
    assert {e.step for e in stored} == {3}
    assert sorted(e.instance_id for e in by_role["train"]) == sorted([SYMPY, SPHINX] * 2)
    assert [e.instance_id for e in by_role["eval"]] == [SPHINX, SPHINX]
    # Every episode the agent function returned to Miles is stored, with the same record,
    # whatever its outcome (the real server can crash an episode: it is stored as failed).
    for step, role in ((train, "train"), (result, "eval")):
        returned = {c["result"]["nemogym"]["episode_id"]: c["result"]["nemogym"] for c in step.hook_calls("agent")}
        assert {e.episode_id: e.record for e in by_role[role]} == returned
    # n samples of one instance are kept apart: own episode, own Miles session, own answer.
    assert len({e.episode_id for e in stored}) == len({e.entry["session_id"] for e in stored}) == 6
    for episode in stored:
        answer = episode.entry["answer"]
        if episode.record["status"] == "ok":
            assert answer["response"]["output"]  # the trajectory as the server sent it
            assert answer["instance_id"] == episode.instance_id
        else:  # a graded-looking answer with the server's error, kept as received
            assert episode.kind == "agent_run_error" and "error" in answer["metadata"]
    assert "sk-store-e2e" not in json.dumps([e.entry for e in stored])

    table = CliRunner().invoke(app, ["episodes", str(store)]).output.splitlines()
    valid = {role: sum(1 for e in by_role[role] if e.record["status"] == "ok") for role in by_role}
    assert [line.split()[:4] for line in table[1:]] == [
        ["eval", "3", "2", str(valid["eval"])],
        ["train", "3", "4", str(valid["train"])],
    ]
    page = tmp_path / "episodes.html"
    assert CliRunner().invoke(app, ["episodes", str(store), "--html", str(page)]).exit_code == 0
    assert page.read_text().count("<details>") == 6
