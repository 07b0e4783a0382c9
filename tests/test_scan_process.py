"""The scan as a process: results reach the disk while other episodes are still in flight,
and Ctrl-C stops cleanly (in-flight episodes cancelled, finished results kept, summary
printed, exit 130). Runs ``scripts/golden_scan.py`` as a file, as users do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.fault_server import FaultServer
from tests.support.prompt_rows import converter_rows, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "golden_scan.py"
QUICK = ["scikit-learn__scikit-learn-14141", "sympy__sympy-20916"]
HELD = ["django__django-10973", "pylint-dev__pylint-4551", "sphinx-doc__sphinx-8595"]


def holding(gym: FaultServer) -> FaultServer:
    """The shared stand-in (``gym_in_thread``), holding the ``HELD`` episodes until the test
    releases them."""
    gym.modes = dict.fromkeys(HELD, "hold")
    return gym


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def result_ids(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["instance_id"] for line in path.read_text().splitlines() if line.strip()]


def start_scan(tmp_path: Path, rows: list[dict[str, Any]], gym: FaultServer, *extra: str) -> subprocess.Popen[str]:
    input_file = write_jsonl(tmp_path / "in.jsonl", converter_rows(rows))
    env = {key: value for key, value in os.environ.items() if not key.startswith("NEMO_GYM_")}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), "--input", str(input_file), "--golden", "--gym-url", gym.url,
         "--output", str(tmp_path / "results.jsonl"), "--concurrency", "5", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )  # fmt: skip


def test_each_result_is_on_disk_while_other_episodes_are_in_flight(
    tmp_path: Path, gym_in_thread: FaultServer, gym_example_rows: list[dict[str, Any]]
) -> None:
    out = tmp_path / "results.jsonl"
    holding(gym_in_thread)
    process = start_scan(tmp_path, gym_example_rows, gym_in_thread)
    try:
        wait_for(lambda: len(result_ids(out)) == len(QUICK), "the quick instances' lines")
        # Read while the three held episodes are still open on the server.
        assert gym_in_thread.held_now() == set(HELD)
        assert sorted(result_ids(out)) == sorted(QUICK)
        gym_in_thread.release.set()
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 1, stderr  # four golden instances are not 1.0
    assert sorted(result_ids(out)) == sorted(QUICK + HELD)
    assert "overall" in stdout


def test_ctrl_c_cancels_in_flight_episodes_keeps_results_and_prints_the_summary(
    tmp_path: Path, gym_in_thread: FaultServer, gym_example_rows: list[dict[str, Any]]
) -> None:
    tmp_path = tmp_path / "[old]"  # a path, printed as written: never read as Rich markup
    tmp_path.mkdir()
    out = tmp_path / "results.jsonl"
    holding(gym_in_thread)
    process = start_scan(tmp_path, gym_example_rows, gym_in_thread)
    try:
        wait_for(
            lambda: len(result_ids(out)) == len(QUICK) and gym_in_thread.held_now() == set(HELD), "in-flight state"
        )
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)  # generous: "returns promptly"
    finally:
        process.kill()

    assert process.returncode == 130, stderr
    assert sorted(result_ids(out)) == sorted(QUICK), "finished results kept, cancelled ones not written"
    overall = next(line for line in stdout.splitlines() if "overall" in line)
    assert overall.replace("│", " ").split()[1] == "2"
    assert "3 of 5 selected instances not run (interrupted)" in stdout
    assert f"in {out}; rerun with --resume to finish" in stderr
    # The client closed the held requests instead of leaving them open.
    wait_for(lambda: sorted(gym_in_thread.disconnected) == sorted(HELD), "the server to see the disconnects", 10)

    # Resuming runs exactly the three cancelled instances.
    gym_in_thread.release.set()
    resumed = start_scan(tmp_path, gym_example_rows, gym_in_thread, "--resume")
    resumed.communicate(timeout=60)
    assert sorted(gym_in_thread.received_ids()) == sorted(QUICK + HELD + HELD)
    assert sorted(result_ids(out)) == sorted(QUICK + HELD)


def test_a_second_scan_on_the_same_results_file_refuses_and_sends_nothing(
    tmp_path: Path, gym_in_thread: FaultServer, gym_example_rows: list[dict[str, Any]]
) -> None:
    out = tmp_path / "results.jsonl"
    holding(gym_in_thread)
    first = start_scan(tmp_path, gym_example_rows, gym_in_thread)
    try:
        wait_for(lambda: gym_in_thread.held_now() == set(HELD), "the first scan's held episodes")
        second = subprocess.run(
            [sys.executable, str(SCRIPT), "--input", str(tmp_path / "in.jsonl"), "--golden",
             "--gym-url", gym_in_thread.url, "--output", str(out), "--resume"],
            capture_output=True,
            text=True,
            timeout=60,
            env={key: value for key, value in os.environ.items() if not key.startswith("NEMO_GYM_")},
        )  # fmt: skip
        assert second.returncode == 2, second.stderr
        assert f"--output {out}: another scan is writing this results file (it holds the file's lock)" in " ".join(
            second.stderr.split()
        )
        gym_in_thread.release.set()
        first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 1
    received = gym_in_thread.received_ids()
    assert sorted(received) == sorted(QUICK + HELD)  # each instance sent once, by the first scan
    assert sorted(result_ids(out)) == sorted(QUICK + HELD)
