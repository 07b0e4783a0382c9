"""``miles-nemogym convert`` through typer's CliRunner: exit codes, messages, files."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app


@pytest.fixture
def jsonl(tmp_path: Path, gym_example_rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "example.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in gym_example_rows), encoding="utf-8")
    return path


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, ["convert", *map(str, args)])


def test_help_lists_the_command_and_its_flags() -> None:
    top = CliRunner().invoke(app, ["--help"])
    assert top.exit_code == 0 and "convert" in top.output
    result = invoke("--help")
    assert result.exit_code == 0
    for flag in ("--input", "--gradeable-only", "--holdout-output", "--instance-ids", "--drop-fields"):
        assert flag in result.output


def test_converts_and_prints_the_summary(tmp_path: Path, jsonl: Path, gym_example_rows: list[dict[str, Any]]) -> None:
    output = tmp_path / "swe.jsonl"
    result = invoke("--input", jsonl, "--output", output, "--split", "test")
    assert result.exit_code == 0, result.output
    lines = output.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["metadata"]["instance_id"] for line in lines] == [
        row["instance_id"] for row in gym_example_rows
    ]
    assert "read" in result.stdout and "written" in result.stdout
    for row in gym_example_rows:
        assert row["repo"] in result.stdout


def test_bad_row_exits_1_with_position_and_writes_nothing(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    rows = copy.deepcopy(gym_example_rows)
    del rows[2]["test_patch"]
    source = tmp_path / "bad.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    output = tmp_path / "out.jsonl"
    result = invoke("-i", source, "-o", output)
    assert result.exit_code == 1
    assert "row 3 (line 3)" in result.stderr and rows[2]["instance_id"] in result.stderr
    assert "test_patch" in result.stderr and "--on-error skip" in result.stderr
    assert not output.exists()
    skipped = invoke("-i", source, "-o", output, "--on-error", "skip", "--quiet")
    assert skipped.exit_code == 0
    assert len(output.read_text().splitlines()) == 4


def test_gradeable_only_prints_the_dropped_repos(tmp_path: Path, gym_example_rows: list[dict[str, Any]]) -> None:
    moto = dict(gym_example_rows[0], instance_id="getmoto__moto-1", repo="getmoto/moto", version="4.1")
    source = tmp_path / "gym.jsonl"
    source.write_text(json.dumps(moto) + "\n" + json.dumps(gym_example_rows[0]) + "\n", encoding="utf-8")
    result = invoke("-i", source, "-o", tmp_path / "out.jsonl", "--gradeable-only")
    assert result.exit_code == 0, result.output
    assert "getmoto/moto (1)" in result.stdout and "not gradeable" in result.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seed", "3"], "--seed only applies with --shuffle"),
        (["--drop-fields", "instance_id"], "cannot drop instance_id"),
        (["--holdout", "2"], "--holdout-output FILE"),
        (["--subset", "lite"], "lite"),
        (["--limit", "0"], "--limit"),
        (["--on-error", "ignore"], "ignore"),
    ],
)
def test_bad_flags_exit_2(tmp_path: Path, jsonl: Path, flags: list[str], message: str) -> None:
    output = tmp_path / "out.jsonl"
    result = invoke("-i", jsonl, "-o", output, *flags)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not output.exists()


def test_output_under_a_file_exits_1(tmp_path: Path, jsonl: Path) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    result = invoke("-i", jsonl, "-o", blocker / "out.jsonl")
    assert result.exit_code == 1
    assert "error:" in result.stderr and str(blocker) in result.stderr
    assert blocker.read_text() == "x"


def test_output_that_is_a_folder_exits_2(tmp_path: Path, jsonl: Path) -> None:
    result = invoke("-i", jsonl, "-o", tmp_path)
    assert result.exit_code == 2
    assert "is a folder" in result.stderr


def test_missing_input_exits_1(tmp_path: Path) -> None:
    result = invoke("-i", tmp_path / "nope.jsonl", "-o", tmp_path / "out.jsonl")
    assert result.exit_code == 1
    assert "no such file" in result.stderr


def test_gradeable_only_without_swebench_exits_1_with_the_install_command(
    tmp_path: Path, jsonl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "swebench" or m.startswith("swebench.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "swebench", None)
    result = invoke("-i", jsonl, "-o", tmp_path / "out.jsonl", "--gradeable-only")
    assert result.exit_code == 1
    assert "pip install 'swebench==4.1.0'" in result.stderr
