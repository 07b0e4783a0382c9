"""``miles-nemogym episodes``: the per-step table, filters, one episode, the HTML page."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from tests.support.episode_stores import build_store


@pytest.fixture
def store(tmp_path: Path, gym_example_rollouts: list[dict[str, Any]]) -> Path:
    build_store(tmp_path / "ep", gym_example_rollouts)
    return tmp_path / "ep"


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, ["episodes", *map(str, args)])


def test_table_per_step_and_role(store: Path, gym_example_rollouts: list[dict[str, Any]]) -> None:
    result = invoke(store)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == [
        "role", "step", "episodes", "valid", "resolved", "mean turns", "mean s", "failures by kind"
    ]  # fmt: skip
    resolved = sum(1 for r in gym_example_rollouts if r["reward"] == 1.0)
    n = len(gym_example_rollouts)
    assert re.split(r"\s{2,}", lines[1]) == [
        "eval",
        "1",
        "2",
        "2",
        f"{100 * float(gym_example_rollouts[0]['reward']):.1f}%",
        "3.0",
        "30.0",
        "-",
    ]
    assert re.split(r"\s{2,}", lines[2]) == [
        "train",
        "1",
        str(n + 1),
        str(n),
        f"{resolved / n:.1%}",
        "3.0",
        f"{(30.0 * n + 2.0) / (n + 1):.1f}",
        "agent_run_error 1",
    ]
    assert lines[3].split()[:4] == ["train", "pending", "1", "1"]


def test_filters_list_the_matching_episodes(store: Path, gym_example_rollouts: list[dict[str, Any]]) -> None:
    first = gym_example_rollouts[0]["instance_id"]
    result = invoke(store, "--instance", first, "--step", "1")
    assert _listed(result.output) == ["eval0", "eval1", "train0", "crash0"]
    assert _listed(invoke(store, "--kind", "agent_run_error").output) == ["crash0"]
    assert gym_example_rollouts[0]["reward"] == 1.0  # the wheel's first result is resolved
    assert _listed(invoke(store, "--kind", "resolved", "--instance", first).output) == ["eval0", "eval1", "train0"]
    none = CliRunner().invoke(app, ["episodes", str(store), "--kind", "unresolved", "--instance", first])
    assert none.exit_code == 0 and none.stdout == ""
    assert none.stderr == f"no episodes match --instance {first} --kind unresolved (of 9 in {store})\n"


def _listed(output: str) -> list[str]:
    """The episode ids of the list printed after the table (after its blank line); a line
    wrapped to fit the terminal continues indented."""
    return [line.split()[0] for line in output.split("\n\n", 1)[1].splitlines() if line[:1].strip()]


def test_show_renders_turns_patch_and_report(store: Path, gym_example_rollouts: list[dict[str, Any]]) -> None:
    result_json = gym_example_rollouts[0]
    out = invoke(store, "--show", "train0").output
    assert out.startswith(f"episode train0   instance {result_json['instance_id']}   train   step 1   session s-train0")
    first_call = next(i for i in result_json["response"]["output"] if i["type"] == "function_call")
    assert "  $ " + json.loads(first_call["arguments"])["command"] in out
    assert "--- turn 1\nthought:\n<think>" in out
    assert result_json["metadata"]["model_patch"].strip() in out
    assert "--- test report\nresolved: " in out and "FAIL_TO_PASS: " in out
    crashed = invoke(store, "--show", "crash0").output
    assert "failure: agent_run_error: HTTP 500: boom" in crashed and "Internal Server Error" in crashed
    missing = invoke(store, "--show", "nope")
    assert missing.exit_code == 2 and "no episode with that id" in missing.output


def test_html_page_is_self_contained(store: Path, tmp_path: Path) -> None:
    page = tmp_path / "episodes.html"
    result = invoke(store, "--html", page)
    assert result.exit_code == 0 and "wrote" in result.output
    text = page.read_text()
    assert text.count("<details>") == 9  # 6 train + 2 eval + 1 pending
    assert text.count('<svg width="520"') == 4  # resolve rate + failure kinds, per role
    assert "http://" not in text.replace("http://127", "") and "<script" not in text
    assert "agent_run_error 1" in text


def test_not_a_folder_names_the_fix(tmp_path: Path) -> None:
    result = invoke(tmp_path / "missing")
    assert result.exit_code == 2 and "NEMO_GYM_EPISODE_DIR" in result.output
