"""Every table and message fits the terminal, 80 columns (the floor) and 120: no line wider,
no word or instance id split across lines (a split word would show as two tokens)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from miles_nemogym.checks import CheckResult, Status
from miles_nemogym.cli.main import app
from miles_nemogym.episode.record import EpisodeRecord
from miles_nemogym.launcher import run as launcher_run
from miles_nemogym.scan._report import ScanProgress, render_summary
from miles_nemogym.scan._results import ResultLine, Verdict
from miles_nemogym.store import EpisodeStore, entry_for
from miles_nemogym.store import views as episodes_cli
from tests.support import tmux
from tests.support.episode_stores import build_store
from tests.support.ports import free_port
from tests.support.prompt_rows import write_jsonl
from tests.support.store_fixtures import LONG_ID, WIDE_KINDS

WIDTHS = pytest.mark.parametrize("width", [80, 120])
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LONG_REASON = (
    "agent_run_error: the sandbox provider could not pull the image swebench/sweb.eval.x86_64."
    "scikit-learn_1776_scikit-learn-14141:latest from the registry after 3 attempts; "
    "check that the Gym host can reach the registry and has room for the image"
)


def fits(text: str, width: int) -> list[str]:
    """The lines of ``text`` (control sequences removed), each checked against ``width``."""
    lines = _ANSI.sub("", text).splitlines()
    assert lines, "nothing was printed"
    too_wide = [line for line in lines if len(line) > width]
    assert not too_wide, f"{len(too_wide)} line(s) wider than {width}: {too_wide[:3]}"
    cut = [line for line in lines if "…" in line or re.search(r"\w\.\.\.$", line)]  # "[ARGS]..." is usage
    assert not cut, f"something was cut: {cut[:3]}"
    return lines


def whole(message: str, text: str) -> None:
    """``message``'s words appear in order in ``text``, none of them split across lines."""
    assert " ".join(message.split()) in " ".join(_ANSI.sub("", text).split())


def terminal(width: int) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=width, force_terminal=True, color_system=None), buffer


# --- scan -------------------------------------------------------------------------------


def scan_results() -> list[ResultLine]:
    repos = ["scikit-learn/scikit-learn", "matplotlib/matplotlib", "Project-MONAI/MONAI", "django/django"]
    results = []
    for number, repo in enumerate(repos * 3):
        verdict = [Verdict.passed, Verdict.failed, Verdict.infra][number % 3]
        results.append(
            ResultLine(
                instance_id=f"{repo.replace('/', '__')}-{14141 + number}",
                repo=repo,
                verdict=verdict,
                reward=1.0 if verdict is Verdict.passed else 0.0,
                seconds=267.4 + number,
                failure_kind="agent_run_error" if verdict is Verdict.infra else None,
                reason=LONG_REASON if verdict is not Verdict.passed else None,
            )
        )
    return results


@WIDTHS
def test_scan_summary_fits_keeping_counts_and_repos_whole(width: int) -> None:
    console, buffer = terminal(width)
    results = scan_results()
    render_summary(console, results, selected=14, earlier=0, golden=True, interrupted=False)

    lines = fits(buffer.getvalue(), width)
    header = next(line for line in lines if "repo" in line)
    for name in ("instances", "passed", "failed", "infra"):
        assert name in header
    assert ("p95 s" in header) is (width >= 120)  # the times go first, only when there is no room
    overall = next(line for line in lines if "overall" in line).replace("│", " ").split()
    assert overall[1:5] == ["12", "4", "4", "4"]
    assert any("scikit-learn/scikit-learn" in line for line in lines)
    for result in results:
        if result.verdict is not Verdict.passed:
            assert any(result.instance_id in line for line in lines)  # ids whole
    whole(LONG_REASON, buffer.getvalue())


@WIDTHS
def test_scan_progress_lines_wrap_between_words(width: int) -> None:
    console, buffer = terminal(width)
    progress = ScanProgress(console, total=3, already_done=[])
    infra = next(result for result in scan_results() if result.verdict is Verdict.infra)
    progress.finished(infra)

    lines = fits(buffer.getvalue(), width)
    assert infra.instance_id in lines[0]
    whole(LONG_REASON.removeprefix("agent_run_error: "), buffer.getvalue())


# --- episodes ---------------------------------------------------------------------------


@WIDTHS
def test_episodes_table_and_list_fit(wide_store: Path, width: int) -> None:
    result = CliRunner().invoke(app, ["episodes", str(wide_store), "--step", "1"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output

    lines = fits(result.output, width)
    assert lines[0].split()[:6] == ["role", "step", "episodes", "valid", "resolve", "rate"]
    assert lines[0].rstrip().endswith("failures by kind")
    table = result.output.split("\n\n")[0]
    for kind in WIDE_KINDS:  # each kind with its count on one line
        assert any(re.search(rf"\b{kind} \d+\b", line) for line in table.splitlines()), kind
    listed = result.output.split("\n\n")[1].splitlines()
    for number in range(12):
        shown = f"{number:02d}0123456789"  # a 12-character prefix, which --show takes
        line = next(line for line in listed if line.startswith(shown + " "))
        assert f" {LONG_ID}{number} " in line  # the instance id whole, on the episode's line
    assert ("step" in listed[0].split()) is (width >= 120)  # step and role go first when there is no room
    first = CliRunner().invoke(app, ["episodes", str(wide_store), "--show", "000123456789"])
    assert first.exit_code == 0 and f"instance {LONG_ID}0" in first.output


LONG_ENVS = ["workplace_assistant", "instruction_following", "equivalence_rule", "mcqa"]


@WIDTHS
def test_episodes_table_per_environment_fits(tmp_path: Path, width: int) -> None:
    folder = tmp_path / "envs"
    writer = EpisodeStore(folder)
    for number in range(16):
        env = LONG_ENVS[number % len(LONG_ENVS)]
        failed = WIDE_KINDS[number % len(WIDE_KINDS)] if number % 3 == 0 else None
        record = {"status": "failed", "mask_sample": True, "failure_kind": failed} if failed else {
            "status": "ok", "mask_sample": False, "turns": 3}  # fmt: skip
        record.update(episode_id=f"{number:032d}", instance_id=f"{env}/{number}", environment=env, attempts=1)
        entry = entry_for(record=EpisodeRecord.model_validate(record), reward=float(number % 2), role="train",
                          eval_set=None, session=None, repo=None)  # fmt: skip
        writer.add("train", entry, b"{}", True)
    writer.seal("train", 1)
    writer.close()
    result = CliRunner().invoke(app, ["episodes", str(folder)], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output

    lines = fits(result.output.split("\n\n")[1], width)
    wide = [
        "role",
        "environment",
        "episodes",
        "valid",
        "pass",
        "rate",
        "reward",
        "mean",
        "turns",
        "failures",
        "by",
        "kind",
    ]
    # Too narrow: the mean turns go first, then the valid count; the reward stays.
    assert lines[0].split() == wide if width >= 120 else [w for w in wide if w not in ("valid", "mean", "turns")]
    for env in LONG_ENVS:  # each environment whole, on its row, with its reward
        assert any(re.match(rf"train\s+{env}\s+\d+\s", line) for line in lines), env
    for kind in WIDE_KINDS[:4]:
        assert any(re.search(rf"\b{kind} \d+\b", line) for line in lines), kind


@WIDTHS
def test_episodes_warnings_about_unreadable_lines_wrap_between_words(
    wide_store: Path, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(episodes_cli, "_stderr_is_terminal", lambda: True)  # wrapped on a terminal only
    step = next((wide_store / "train").glob("step-000001-*.jsonl.gz"))
    odd = step.with_name("step-000002-odd.jsonl")
    odd.write_text('{"episode_id": "odd", "reward": "many", "record": {"elapsed_s": "long"}}\n[1, 2]\n')
    result = CliRunner().invoke(app, ["episodes", str(wide_store)], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output

    lines = result.stderr.splitlines()
    assert len(lines) > 2 and all(line.startswith(("warning:", "    ")) for line in lines)
    # Within the width, except a path longer than the line itself, which stands whole on a line of its own.
    assert all(len(line) <= width or " " not in line.strip() for line in lines), lines
    assert f"{odd}:1:" in lines[0].split() or f"    {odd}:1:" in lines  # the path never split
    assert "field of the wrong type: reward" in " ".join(line.strip() for line in lines)


# --- help, converter, doctor, preflight -------------------------------------------------


@WIDTHS
def test_bare_command_lists_every_description_whole(width: int) -> None:
    result = CliRunner().invoke(app, [], env={"COLUMNS": str(width)})
    assert result.exit_code == 0
    fits(result.output, width)
    whole(
        "scan Run SWE-bench instances, or environment rows, through NeMo-Gym exactly as training will, and report.",
        result.output,
    )
    whole("doctor Check in seconds that NeMo-Gym is reachable and will use the trainer's policy URL.", result.output)


@WIDTHS
def test_converter_notes_and_hub_error_wrap_between_words(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]], width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # short paths: the notes are under test, not a long $TMPDIR
    tmp_path = Path(".")
    source = write_jsonl(tmp_path / "raw.jsonl", gym_example_rows)
    missing = [f"{LONG_ID}{number}" for number in range(8)]
    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join([gym_example_rows[0]["instance_id"], *missing]) + "\n")
    on_a_terminal = {"COLUMNS": str(width), "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}
    converted = CliRunner().invoke(
        app,
        ["convert", "-i", str(source), "-o", str(tmp_path / "out.jsonl"), "--instance-ids", str(ids)],
        env=on_a_terminal,
    )
    assert converted.exit_code == 0, converted.output
    fits(converted.output, width)
    whole(f"note: 8 ids from --instance-ids not in the input: {', '.join(missing)}", converted.output)

    hub = f"http://127.0.0.1:{free_port()}"
    failed = CliRunner().invoke(
        app,
        ["convert", "-i", "princeton-nlp/SWE-bench_Verified", "-o", str(tmp_path / "hub.jsonl")],
        env={**on_a_terminal, "HF_ENDPOINT": hub},
    )
    assert failed.exit_code == 1
    fits(failed.output, width)
    whole("without access to the hub, download it elsewhere and pass the folder or a parquet/JSONL file", failed.output)


FAILED_CHECK = CheckResult(
    "/run accepts policy_base_url",
    Status.failed,
    f"http://gym-host.example.internal:12000: the /run body (MiniSWEAgentRunRequest) declares no policy_base_url, "
    f"so this server would ignore the trainer's policy URL (e.g. {LONG_ID})",
    "run nemo-gym 0.7.0 (the version this package is tested with) or any release whose mini_swe_agent_2 /run "
    "takes policy_base_url",
)


@WIDTHS
def test_preflight_lines_wrap_between_words(
    width: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    launcher_run._print_results([FAILED_CHECK])
    out = capsys.readouterr().out
    lines = fits(out, width)
    assert lines[0].startswith("FAIL /run accepts policy_base_url:")
    assert all(line.startswith("     ") for line in lines[1:-1])  # continuations under the detail
    whole(FAILED_CHECK.detail, out)
    whole(f"fix: {FAILED_CHECK.fix}", out)


@WIDTHS
def test_doctor_lines_wrap_between_words(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEMO_GYM_URL", raising=False)
    gym = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["doctor", "--gym-url", gym, "--timeout", "2"], env={"COLUMNS": str(width)})
    assert result.exit_code == 1
    fits(result.output, width)
    refused = f"FAIL NeMo-Gym answers: GET {gym}/openapi.json: connection refused (nothing listens on that port)"
    whole(refused, result.output)
    whole("fix: start the server (`miles-nemogym serve`, or `gym env start` with the mini_swe_agent_2", result.output)


def test_a_word_longer_than_the_width_is_kept_whole() -> None:
    from miles_nemogym import fit

    path = "/very/long/" + "x" * 100
    assert fit.wrap([f"note: written to {path} today"], 80) == ["note: written to", path, "today"]
    assert json.dumps(fit.table([["a", path]], 80).splitlines()) == json.dumps([f"a  {path}"])
    assert fit.table([["x", "kind_a 1, kind_b 2"]], 14).splitlines() == ["x  kind_a 1,", "   kind_b 2"]
    assert fit.table([["x", "resolved  reward 1.0"]], 14).splitlines() == ["x  resolved", "   reward 1.0"]


@WIDTHS
def test_episodes_list_is_one_line_per_episode(wide_store: Path, width: int) -> None:
    result = CliRunner().invoke(app, ["episodes", str(wide_store), "--step", "1"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    listed = fits(result.output.split("\n\n")[1], width)
    header = listed[0].split()
    assert header[:2] == ["episode", "instance"] and header[-1] == "verdict" and "reward" in header
    assert len(listed) == 1 + 12  # the header, then each episode on one line
    for line in listed[1:]:
        cells = line.split()
        assert cells[-1] in {*WIDE_KINDS, "resolved", "unresolved"}, line
    turns = [line.split()[-2] for line in listed[1:]]
    assert set(turns) == {"41", "-"} if width >= 120 else "turns" not in listed[0]  # the longest kinds need room


@WIDTHS
def test_episodes_show_on_a_terminal_wraps_between_words(
    tmp_path: Path, gym_example_rollouts: list[dict[str, Any]], width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_store(tmp_path / "store", gym_example_rollouts)
    for episode in ("train0", "crash0"):
        show = ["episodes", str(tmp_path / "store"), "--show", episode]
        piped = CliRunner().invoke(app, show, env={"COLUMNS": str(width)})
        assert piped.exit_code == 0, piped.output
        if episode == "train0":  # the real trajectory's lines run long; in a pipe each stays whole
            assert any(len(line) > width for line in piped.output.splitlines())
        with monkeypatch.context() as patch:
            patch.setattr(episodes_cli, "_stdout_is_terminal", lambda: True)
            shown = CliRunner().invoke(app, show, env={"COLUMNS": str(width)})
        assert shown.exit_code == 0, shown.output
        lines = shown.output.splitlines()
        too_wide = [line for line in lines if len(line) > width and " " in line.strip()]
        assert not too_wide, too_wide[:3]  # only a word longer than the line stands past it
        assert shown.output.split() == piped.output.split()  # the same words, none split


HELPS = [[], *([name, "--help"] for name in ("convert", "doctor", "episodes", "examples", "scan", "serve", "smoke"))]


@WIDTHS
@pytest.mark.parametrize("command", HELPS, ids=lambda c: c[0] if c else "bare")
def test_every_help_fits(width: int, command: list[str]) -> None:
    result = CliRunner().invoke(app, command, env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    fits(result.output, width)


# --- a real terminal: a tmux pane of 80x24 ----------------------------------------------

needs_tmux = pytest.mark.skipif(
    tmux.TMUX is None and not os.environ.get("MILES_NEMOGYM_CI"),
    reason="no tmux on PATH (Debian: apt-get install tmux; .ci/run installs it, and there it never skips)",
)
CLI = [sys.executable, "-m", "miles_nemogym.cli.main"]


def in_one_process(*commands: list[str]) -> list[str]:
    """``miles-nemogym`` run with each argument list in turn, in one Python process on the pane's
    terminal: a process start per command would double these tests' time."""
    code = (
        "from miles_nemogym.cli.main import app\n"
        f"for args in {commands!r}:\n"
        "    try:\n"
        "        app(args, prog_name='miles-nemogym')\n"
        "    except SystemExit:\n"
        "        pass\n"
    )
    return [sys.executable, "-c", code]


@needs_tmux
def test_in_a_real_80_column_terminal_no_line_runs_past_the_edge(
    tmp_path: Path, gym_example_rollouts: list[dict[str, Any]], wide_store: Path
) -> None:
    """episodes --show and --step, examples' refusal and every --help, in one 80x24 tmux pane: the terminal
    wrapped no line (a word at the edge would be cut in two), and each episode is one line."""
    build_store(tmp_path / "shown", gym_example_rollouts)
    commands = in_one_process(
        ["episodes", str(tmp_path / "shown"), "--show", "crash0"],
        ["episodes", str(tmp_path / "shown"), "--show", "train0"],
        ["episodes", str(wide_store), "--step", "1"],
        ["examples", "--env", "mcq"],  # the unknown name's message, close matches on one line
        *HELPS,
    )
    pane = tmux.capture([commands], 80, 24)
    assert any("'mcq' is not an environment nemo-gym ships (did you mean mcqa," in line for line in pane.shown)
    assert sum(1 for line in pane.shown if line.startswith("Usage: ")) == len(HELPS), pane.shown[-40:]
    wrapped = [line for line in pane.joined if len(line) > 80]
    assert pane.shown == pane.joined, f"the terminal wrapped {wrapped[:3]}"
    listed = [line for line in pane.shown if re.match(r"\d{12}  ", line)]
    assert len(listed) == 12 and all(LONG_ID in line for line in listed)  # one line per episode


# --- one output rule: wrapped on a terminal only, never inside a path ---------------------

BUILD_LOG = "/cache/gym-venv/" + "py3.13-nemo-gym0.7.0-mini-swe-agent2.1.0-swebench4.1.0-r2" * 2 + ".build.log"


@pytest.mark.parametrize("on_a_terminal", [False, True], ids=["file", "terminal"])
def test_build_notes_keep_their_path_whole(on_a_terminal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from miles_nemogym.cli._console import console, step_display

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TTY_COMPATIBLE", "1" if on_a_terminal else "0")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    note = f"note: pip's full log: {BUILD_LOG} (the build's own lines)"
    with step_display(console(stderr=True)) as progress:  # serve's and smoke's progress display
        progress(note)
    lines = [line.rstrip() for line in _ANSI.sub("", sys.stderr.getvalue()).splitlines()]
    start = next(number for number, line in enumerate(lines) if line.startswith("note: "))
    if on_a_terminal:  # between words at 80 columns; the path, longer than the line, whole on its own
        assert lines[start : start + 3] == ["note: pip's full log:", BUILD_LOG, "(the build's own lines)"]
    else:  # in a file, never wrapped
        assert lines[start] == note


@needs_tmux
def test_in_a_real_80_column_terminal_sources_and_notes_fit(tmp_path: Path) -> None:
    """examples' source and convert's summary and notes in one 80x24 tmux pane: nothing runs past the edge."""
    convert = ["convert", "--env", "mcqa=mc.jsonl", "--env", "workplace_assistant=wa.jsonl", "-o", "o.jsonl"]
    commands = [
        ["cd", str(tmp_path)],  # short relative paths: a path longer than the pane is the terminal's to wrap
        in_one_process(
            ["examples", "--env", "mcqa", "-o", "mc.jsonl"],
            ["examples", "--env", "workplace_assistant", "-o", "wa.jsonl"],
            [*convert, "--quiet"],
        ),
    ]
    pane = tmux.capture(commands, 80, 24)
    assert sum(1 for line in pane.shown if line == "source: resources_servers/mcqa/data/example.jsonl") == 1
    assert "note: rows are in input order, one environment after another (--shuffle mixes)" in pane.shown
    wrapped = [line for line in pane.joined if len(line) > 80]
    assert pane.shown == pane.joined, f"the terminal wrapped {wrapped[:3]}"


def test_converter_notes_fit_80_columns_even_in_a_file(tmp_path: Path, gym_example_rows: list[dict[str, Any]]) -> None:
    from tests.support.environment_rows import shipped_text

    raw = write_jsonl(tmp_path / "raw.jsonl", gym_example_rows)
    for name in ("mcqa", "workplace_assistant"):
        (tmp_path / f"{name}.jsonl").write_bytes(shipped_text(name))
    held = ["-i", str(raw), "--holdout", "1", "--holdout-output", str(tmp_path / "held.jsonl")]
    envs = [f"--env={name}={tmp_path / name}.jsonl" for name in ("mcqa", "workplace_assistant")]
    notes = []
    for flags in (held, envs):
        result = CliRunner().invoke(app, ["convert", *flags, "-o", str(tmp_path / "out.jsonl"), "--quiet"])
        assert result.exit_code == 0, result.output
        notes += [line for line in result.output.splitlines() if line.startswith("note: ")]
    assert any("holdout" in note for note in notes) and any("input order" in note for note in notes)
    fits("\n".join(notes), 80)


LONG_FOLDER = "a-folder-with-a-long-name-" * 4


def test_a_long_path_in_a_file_is_whole_on_one_line(tmp_path: Path) -> None:
    """serve's refusal written to a file at COLUMNS=80 (as CI logs are): the path on one line."""
    bad = tmp_path / LONG_FOLDER / "provider.yaml"
    bad.parent.mkdir()
    bad.write_text("options: [\n")
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        command = [*CLI, "serve", "--provider-config", str(bad), "--dry-run"]
        env = {**os.environ, "COLUMNS": "80", "TTY_COMPATIBLE": "0"}
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, timeout=120)
    assert done.returncode == 2, log.read_text()
    assert f"error: --provider-config {bad}: not valid YAML" in log.read_text().splitlines()[0]


def test_convert_on_a_terminal_keeps_a_long_input_path_whole(tmp_path: Path) -> None:
    from tests.support.environment_rows import shipped_text

    rows = tmp_path / LONG_FOLDER / "wa.jsonl"
    rows.parent.mkdir()
    rows.write_bytes(shipped_text("workplace_assistant"))
    on_a_terminal = {"COLUMNS": "80", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}
    flags = ["--env", f"workplace_assistant={rows}", "-o", str(tmp_path / "o.jsonl"), "--quiet"]
    result = CliRunner().invoke(app, ["convert", *flags], env=on_a_terminal)
    assert result.exit_code == 0, result.output
    lines = [line.rstrip() for line in _ANSI.sub("", result.output).splitlines()]
    assert lines[:3] == ["convert:", str(rows), "(NeMo-Gym environment rows)"]  # between words, the path whole


def test_scan_header_fits_80_columns_keeping_the_url_whole() -> None:
    from miles_nemogym.scan._report import header

    how = "mode golden, concurrency 16, episode timeout 1800s"
    said = header(12, 500, "http://gym-host.example.internal:12000/run", how)
    assert fits(said, 80) == [
        "scan: 12 of 500 selected instances to run on",
        "  http://gym-host.example.internal:12000/run",
        f"  {how}",
    ]
    where = "NEMO_GYM_ENVS " + ", ".join(
        f"{name} (http://gym-host.example.internal:1200{n})" for n, name in enumerate(LONG_ENVS)
    )
    lines = fits(header(4, 4, where, how), 80)
    whole(f"scan: 4 of 4 selected instances to run on {where}", "\n".join(lines))
