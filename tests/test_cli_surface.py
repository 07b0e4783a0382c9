"""The command line's surface: help, exit codes, shared options and the examples command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.gym import wheel as gym_wheel

COMMANDS = ("convert", "doctor", "examples", "scan", "serve", "smoke")


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), terminal_width=100)


def test_bare_command_prints_help_and_exits_0() -> None:
    result = invoke()
    assert result.exit_code == 0
    assert "Usage: miles-nemogym" in result.output
    for command in COMMANDS:
        assert command in result.output


def test_version() -> None:
    from importlib.metadata import version

    result = invoke("--version")
    assert result.exit_code == 0
    assert result.output.strip() == f"miles-nemogym {version('miles-nemogym')}"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_no_bool_placeholder(command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0
    assert "<bool>" not in result.output
    assert "╭" not in result.output  # plain text: readable in logs and at 80 columns


def test_choices_are_shown() -> None:
    assert "--subset [verified|gym]" in invoke("scan", "--help").output
    assert "--subset [verified|gym]" in invoke("convert", "--help").output
    serve = " ".join(invoke("serve", "--help").output.split())
    assert "--sandbox PROVIDER Sandbox provider, one of docker, daytona, e2b, ecs_fargate, opensandbox, " in serve
    assert "openshell, enroot, apptainer, local: a container one" in serve


@pytest.mark.parametrize("command", ["scan", "convert"])
def test_a_wrong_subset_gets_a_plain_message(command: str, tmp_path: Path) -> None:
    result = invoke(
        command, "--input", str(tmp_path / "x.jsonl"), "--output", str(tmp_path / "o.jsonl"), "--subset", "foo"
    )
    assert result.exit_code == 2
    assert "'foo' is not one of: verified, gym." in result.output
    assert "Value error" not in result.output


def test_instance_ids_grammar_is_the_same_for_scan_and_convert() -> None:
    scan_help, convert_help = invoke("scan", "--help").output, invoke("convert", "--help").output
    for text in (scan_help, convert_help):
        assert "--instance-ids FILE|ID,ID" in text
        assert "comma-separated list of ids" in " ".join(text.split())


def test_convert_takes_a_comma_list_of_instance_ids(tmp_path: Path, gym_example_rows: list[dict[str, Any]]) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in gym_example_rows), encoding="utf-8")
    output = tmp_path / "out.jsonl"
    wanted = ["sympy__sympy-20916", "django__django-10973"]
    result = invoke("convert", "--input", str(source), "--output", str(output), "--instance-ids", ",".join(wanted))
    assert result.exit_code == 0, result.output
    written = [json.loads(line)["metadata"]["instance_id"] for line in output.read_text().splitlines()]
    assert sorted(written) == sorted(wanted)


def test_doctor_takes_gym_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", "http://127.0.0.1:9")
    result = invoke("doctor", "--gym-url", "not a url", "--timeout", "0.5")
    assert result.exit_code == 1
    assert "not a url" in result.output


def test_examples_writes_the_shipped_rows_and_says_where_from(tmp_path: Path) -> None:
    output = tmp_path / "examples.jsonl"
    result = CliRunner().invoke(app, ["examples", "--output", str(output)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert rows == gym_wheel.example_rows()
    assert f"wrote 5 rows to {output}" in result.output
    assert f"source: {gym_wheel.EXAMPLES_MEMBER}\n  in {gym_wheel.wheel_path()}\n" in result.output


def test_convert_says_where_each_rows_subset_came_from(tmp_path: Path, gym_example_rows: list[dict[str, Any]]) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in gym_example_rows), encoding="utf-8")
    result = invoke("convert", "--input", str(source), "--output", str(tmp_path / "out.jsonl"))
    assert result.exit_code == 0, result.output
    assert "note: subset: each row's own (--subset sets all; a row without one is refused)" in (
        " ".join(result.output.split())
    )
    forced = invoke("convert", "--input", str(source), "--output", str(tmp_path / "o2.jsonl"), "--subset", "gym")
    assert "note: subset: --subset gym, for every row" in forced.output
