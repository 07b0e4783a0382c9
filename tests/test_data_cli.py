"""``miles-nemogym convert`` through typer's CliRunner: exit codes, messages, files."""

from __future__ import annotations

import copy
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from tests.support.limited_cli import run_limited


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, ["convert", *map(str, args)])


def test_help_lists_the_command_and_its_flags() -> None:
    top = CliRunner().invoke(app, ["--help"])
    assert top.exit_code == 0 and "convert" in top.output
    result = invoke("--help")
    assert result.exit_code == 0
    for flag in ("--input", "--gradeable-only", "--holdout-output", "--instance-ids", "--drop-fields"):
        assert flag in result.output


def test_converts_and_prints_the_summary(
    tmp_path: Path, example_jsonl: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    output = tmp_path / "swe.jsonl"
    result = invoke("--input", example_jsonl, "--output", output, "--split", "test")
    assert result.exit_code == 0, result.output
    lines = output.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["metadata"]["instance_id"] for line in lines] == [
        row["instance_id"] for row in gym_example_rows
    ]
    assert "read" in result.stdout and "written" in result.stdout
    for row in gym_example_rows:
        assert row["repo"] in result.stdout


def test_the_seed_is_offered_for_repeating_only_when_it_was_drawn(tmp_path: Path, example_jsonl: Path) -> None:
    drawn = invoke("--input", example_jsonl, "--output", tmp_path / "a.jsonl", "--split", "test", "--shuffle")
    assert drawn.exit_code == 0, drawn.output
    assert "to repeat" in drawn.stdout and "pass --seed" in " ".join(drawn.stdout.split())
    given = invoke(
        "--input", example_jsonl, "--output", tmp_path / "b.jsonl", "--split", "test", "--shuffle", "--seed", "0"
    )
    assert given.exit_code == 0, given.output
    assert "shuffled with seed 0" in given.stdout and "to repeat" not in given.stdout


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
def test_bad_flags_exit_2(tmp_path: Path, example_jsonl: Path, flags: list[str], message: str) -> None:
    output = tmp_path / "out.jsonl"
    result = invoke("-i", example_jsonl, "-o", output, *flags)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not output.exists()


def test_output_under_a_file_exits_1(tmp_path: Path, example_jsonl: Path) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    result = invoke("-i", example_jsonl, "-o", blocker / "out.jsonl")
    assert result.exit_code == 1
    assert "error:" in result.stderr and str(blocker) in result.stderr
    assert blocker.read_text() == "x"


def test_output_that_is_a_folder_exits_2(tmp_path: Path, example_jsonl: Path) -> None:
    result = invoke("-i", example_jsonl, "-o", tmp_path)
    assert result.exit_code == 2
    assert "is a folder" in result.stderr


def test_missing_input_exits_1(tmp_path: Path) -> None:
    result = invoke("-i", tmp_path / "nope.jsonl", "-o", tmp_path / "out.jsonl")
    assert result.exit_code == 1
    assert "no such file" in result.stderr


def test_gradeable_only_without_swebench_exits_1_with_the_install_command(
    tmp_path: Path, example_jsonl: Path, swebench_missing: None
) -> None:
    result = invoke("-i", example_jsonl, "-o", tmp_path / "out.jsonl", "--gradeable-only")
    assert result.exit_code == 1
    assert "pip install 'swebench==4.1.0'" in result.stderr


# --- outputs that must not be replaced, inputs that must not be overwritten ----------------


def test_output_that_is_a_symlink_exits_2_and_the_link_and_its_target_stay(tmp_path: Path, example_jsonl: Path) -> None:
    target = tmp_path / "kept.jsonl"
    target.write_text("keep me\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    result = invoke("-i", example_jsonl, "-o", link)
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert f"{link} is a symbolic link; the output would replace the link itself" in message
    assert f"give its target ({target}) or a new path" in message
    assert link.is_symlink() and target.read_text() == "keep me\n"
    holdout = invoke("-i", example_jsonl, "-o", tmp_path / "out.jsonl", "--holdout", "1", "--holdout-output", link)
    assert holdout.exit_code == 2 and "is a symbolic link" in holdout.stderr
    assert link.is_symlink() and not (tmp_path / "out.jsonl").exists()


def test_output_that_is_a_symlink_loop_exits_2_with_the_fix_not_a_traceback(
    tmp_path: Path, example_jsonl: Path
) -> None:
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    result = invoke("-i", example_jsonl, "-o", loop)
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert f"{loop} is a symbolic link" in message and "points back to itself: remove it or give a new path" in message
    assert loop.is_symlink()


def test_output_that_is_a_pipe_exits_2_and_stays_a_pipe(tmp_path: Path, example_jsonl: Path) -> None:
    # A named pipe stands in for /dev/null, which a root run of the old code replaced by a file.
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    result = invoke("-i", example_jsonl, "-o", pipe)
    assert result.exit_code == 2, result.output
    assert "is not a regular file (a device, pipe or socket)" in " ".join(result.stderr.split())
    assert stat.S_ISFIFO(pipe.stat().st_mode)


def test_output_onto_the_instance_ids_file_exits_2_and_leaves_it(tmp_path: Path, example_jsonl: Path) -> None:
    ids = tmp_path / "ids.txt"
    ids.write_text("astropy__astropy-12907\n")
    result = invoke("-i", example_jsonl, "-o", ids, "--instance-ids", ids)
    assert result.exit_code == 2, result.output
    assert f"must differ from --instance-ids ({ids})" in " ".join(result.stderr.split())
    assert ids.read_text() == "astropy__astropy-12907\n"
    hard_link = tmp_path / "input-again.jsonl"
    os.link(example_jsonl, hard_link)  # the same file under another name
    before = example_jsonl.read_bytes()
    again = invoke("-i", example_jsonl, "-o", hard_link)
    assert again.exit_code == 2 and "must differ from --input" in again.stderr
    assert example_jsonl.read_bytes() == before


def test_a_lone_surrogate_in_a_bad_rows_id_is_printed_escaped(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    bad = dict(gym_example_rows[1], instance_id="bad\udcff")
    del bad["test_patch"]
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps(gym_example_rows[0]) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    output = tmp_path / "out.jsonl"
    result = invoke("-i", source, "-o", output, "--on-error", "skip", "--quiet")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 0, result.output
    assert "row 2 (line 2) [bad\\udcff]: " in result.stdout
    assert len(output.read_text().splitlines()) == 1


# --- interrupted by a signal -------------------------------------------------------------

# The real CLI in a child process, its reader slowed so a signal lands mid-conversion.
SLOW_CONVERT = """
import importlib, sys, time
from miles_nemogym.data._sources import RowSource

convert_module = importlib.import_module("miles_nemogym.data._convert")

opened = convert_module.open_source

def slow_source(spec, split):
    source = opened(spec, split)
    def rows():
        for row in source:
            time.sleep(0.01)
            yield row
    return RowSource(source.name, source.kind, source.total, rows())

convert_module.open_source = slow_source
from miles_nemogym.cli.main import app
from tests.support.limited_cli import run_limited
sys.argv = ["miles-nemogym", *sys.argv[1:]]
app()
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_convert_leaves_no_temporary_file_or_spool(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]], signum: signal.Signals
) -> None:
    source = tmp_path / "many.jsonl"
    with source.open("w", encoding="utf-8") as handle:
        for number in range(400):
            row = gym_example_rows[number % len(gym_example_rows)]
            handle.write(json.dumps(dict(row, instance_id=f"{row['instance_id']}-{number}")) + "\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    existing = out_dir / "train.jsonl"
    existing.write_text("the previous conversion\n")
    child = subprocess.Popen(
        [sys.executable, "-c", SLOW_CONVERT, "convert", "-i", str(source), "-o", str(existing),
         "--shuffle", "--holdout", "5", "--holdout-output", str(out_dir / "eval.jsonl"), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As in a terminal: a test run started in the background inherits SIGINT ignored, and the
        # child would never see the Ctrl-C this test sends (it then finished with exit 0).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        # Output, holdout and the shuffle spool are open, and rows have reached the disk: mid-conversion.
        while not (len(temporary := list(out_dir.glob(".*.tmp"))) == 3 and any(p.stat().st_size for p in temporary)):
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
        child.send_signal(signum)
        _, stderr = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, stderr
    assert "interrupted: nothing written, no file touched" in stderr
    assert "Traceback" not in stderr
    assert sorted(path.name for path in out_dir.iterdir()) == ["train.jsonl"]
    assert existing.read_text() == "the previous conversion\n"


def test_sigterm_is_an_interrupt_only_inside_a_command_and_handlers_come_back() -> None:
    import signal

    from miles_nemogym.cli._console import interrupt_on_signals

    term, hup, sigint = (signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT))
    with pytest.raises(KeyboardInterrupt), interrupt_on_signals(ctrl_c=True):
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.raise_signal(signal.SIGTERM)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == (term, hup)
    assert signal.getsignal(signal.SIGINT) == sigint


# A command whose terminal closes (``nohup``: SIGHUP ignored, given as argv[2]); SIGUSR1 asks it
# whether it is still running, SIGTERM stops it.
HANGUP = """
import os, signal, sys
from miles_nemogym.cli._console import interrupt_on_signals
# Each shell's own SIGHUP, whatever the test run inherited (a suite run under nohup ignores it).
signal.signal(signal.SIGHUP, signal.SIG_IGN if sys.argv[2] == "nohup" else signal.SIG_DFL)
signal.signal(signal.SIGUSR1, lambda *_: print("still running", flush=True))
try:
    with interrupt_on_signals():
        print("started", flush=True)
        while True:
            signal.pause()
except KeyboardInterrupt:
    for _ in range(10):
        print("stopping the servers ...", flush=True)  # EIO on the closed terminal but for the handler
        print("stopping the servers ...", file=sys.stderr, flush=True)
    open(sys.argv[1], "w").write("cleaned up")
"""


def _line(terminal: int) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        line += os.read(terminal, 1)
    return line.strip()


@pytest.mark.parametrize("shell", ["terminal", "nohup"])
def test_a_closed_terminal_stops_a_command_as_ctrl_c_does_unless_under_nohup(tmp_path: Path, shell: str) -> None:
    """``serve`` and ``smoke`` start servers in their own sessions: a hangup never reaches them,
    so the command must stop them itself, though printing to the closed terminal would fail;
    under ``nohup`` the user asked it to outlive the terminal."""
    marker = tmp_path / "done"
    terminal, child_end = os.openpty()
    child = subprocess.Popen([sys.executable, "-c", HANGUP, str(marker), shell], stdout=child_end, stderr=child_end)
    os.close(child_end)
    try:
        assert _line(terminal) == b"started"
        if shell == "nohup":  # (its output would go to nohup.out: here the terminal stays open)
            child.send_signal(signal.SIGHUP)
            child.send_signal(signal.SIGUSR1)  # delivered after the SIGHUP, which it ignored
            assert _line(terminal) == b"still running"
            child.send_signal(signal.SIGTERM)
        else:
            os.close(terminal)  # the terminal is gone, then the kernel's hangup
            terminal = -1
            child.send_signal(signal.SIGHUP)
        assert child.wait(timeout=30) == 0
    finally:
        if terminal >= 0:
            os.close(terminal)
        if child.poll() is None:
            child.kill()
            child.wait()
    assert marker.read_text() == "cleaned up"


# --- every file or none, and the message says which --------------------------------------

# The real CLI in a child process whose first move of an output into place sends it SIGTERM:
# the signal lands between the renames of one commit.
SIGTERM_BETWEEN_RENAMES = """
import os, signal, sys

moved = os.replace

def replace(source, target, **kwargs):
    moved(source, target, **kwargs)
    if str(target).endswith(".jsonl"):
        os.replace = moved
        os.kill(os.getpid(), signal.SIGTERM)

os.replace = replace
from miles_nemogym.cli.main import app
from tests.support.limited_cli import run_limited
sys.argv = ["miles-nemogym", *sys.argv[1:]]
app()
"""


def test_sigterm_between_the_renames_waits_for_them_and_says_every_file_was_written(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in gym_example_rows), encoding="utf-8")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    train, held = out_dir / "train.jsonl", out_dir / "eval.jsonl"
    train.write_text("old train\n")
    held.write_text("old eval\n")
    child = subprocess.run(
        [sys.executable, "-c", SIGTERM_BETWEEN_RENAMES, "convert", "-i", str(source), "-o", str(train),
         "--holdout", "2", "--holdout-output", str(held), "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == 130, child.stderr
    # Before: the eval file was new, the training file old, and the message said nothing was written.
    assert len(train.read_text().splitlines()) == 3 and len(held.read_text().splitlines()) == 2
    message = " ".join(child.stderr.split())
    assert f"interrupted once every file was written: {train}, {held}" in message
    assert "nothing written" not in message and "Traceback" not in message
    assert sorted(path.name for path in out_dir.iterdir()) == ["eval.jsonl", "train.jsonl"]


@pytest.mark.parametrize("shuffle", [False, True], ids=["streamed", "shuffled"])
def test_a_write_error_removes_every_temporary_file_and_folder_and_names_the_file(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]], shuffle: bool
) -> None:
    source = tmp_path / "many.jsonl"
    with source.open("w", encoding="utf-8") as handle:
        for number in range(200):
            row = gym_example_rows[number % len(gym_example_rows)]
            handle.write(json.dumps(dict(row, instance_id=f"{row['instance_id']}-{number}")) + "\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    train = out_dir / "train.jsonl"
    train.write_text("the previous conversion\n")
    held = out_dir / "new" / "eval" / "eval.jsonl"
    done = run_limited(
        "convert", "-i", source, "-o", train, "--holdout", "2", "--holdout-output", held, "--quiet",
        *(["--shuffle"] if shuffle else []), file_size=500_000,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    spooled = " (the rows spooled beside it)" if shuffle else ""
    assert f"error: cannot write {train}{spooled}: File too large" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
    assert sorted(path.name for path in out_dir.iterdir()) == ["train.jsonl"]  # no temporary file, no new folder
    assert train.read_text() == "the previous conversion\n"


def test_examples_writes_through_the_same_writer(tmp_path: Path) -> None:
    existing = tmp_path / "examples.jsonl"
    existing.write_text("kept\n")
    done = run_limited("examples", "-o", existing, file_size=1000)
    assert done.returncode == 1, done.stderr
    assert f"error: cannot write {existing}: File too large" in done.stderr and "Traceback" not in done.stderr
    assert existing.read_text() == "kept\n"  # never truncated in place
    assert [path.name for path in tmp_path.iterdir()] == ["examples.jsonl"]
    link = tmp_path / "link.jsonl"
    link.symlink_to(existing)
    refused = CliRunner().invoke(app, ["examples", "-o", str(link)])
    assert refused.exit_code == 2, refused.output
    assert f"{link} is a symbolic link" in " ".join(refused.output.split())
    assert link.is_symlink() and existing.read_text() == "kept\n"
    written = CliRunner().invoke(app, ["examples", "-o", str(existing)])
    assert written.exit_code == 0, written.output
    assert len(existing.read_text().splitlines()) == 5
    assert existing.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _cpu_s(pid: int) -> tuple[float, str]:
    """(CPU seconds a process has used, its state letter: ``Z`` once it has exited) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), fields[0]


def test_a_mix_at_the_size_bound_stops_within_seconds_of_sigterm(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps(
                {"id": f"t{n}", "responses_create_params": {"input": "hi"}, "agent_ref": {"name": "a_simple_agent"}}
            )
            + "\n"
            for n in range(10)
        )
    )
    out_dir = tmp_path / "out"
    child = subprocess.Popen(
        [sys.executable, "-m", "miles_nemogym.cli.main", "convert", "--env", f"a={rows}:1", "--own-env", "a",
         "--size", "1000000", "-o", str(out_dir / "train.jsonl"), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        # Rows of the million (~11 s to write in all) have reached the disk: SIGTERM lands mid-write.
        while not any(p.stat().st_size for p in out_dir.glob(".train.jsonl.*.tmp")):
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
        signalled = _cpu_s(child.pid)
        child.send_signal(signal.SIGTERM)
        # Its CPU time after the signal, read while it is a zombie: what stopping cost it, whatever
        # the machine's load (finishing the million rows costs ~11 s of CPU).
        while (ended := _cpu_s(child.pid))[1] != "Z":
            assert time.monotonic() < deadline + 60, "no exit after SIGTERM"
            time.sleep(0.05)
        _, stderr = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, stderr
    spent = ended[0] - signalled[0]
    assert spent < 2, f"{spent:.1f} s of CPU from SIGTERM to exit"
    assert "interrupted: nothing written, no file touched" in stderr
    assert not out_dir.exists()  # the folder it made is gone with its temporary files
