"""Ctrl-C during ``smoke`` (a real SIGINT to a real subprocess, on the stand-in server of
``tests/support/stand_in_gym``): it says "interrupted", gives the step it interrupted no ✓, and
removes the folder it made or names the one it keeps."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from miles_nemogym.gym.venv import READY_MARKER, venv_key
from tests.support.eventually import eventually
from tests.support.scripts import shell_script
from tests.support.stand_in_gym import stand_in_env


def _interrupted(root: Path, env: dict[str, str], event: str, *arguments: str) -> tuple[int, str]:
    """``smoke ARGUMENTS`` given Ctrl-C (SIGINT to its process group, as a terminal sends it) once the
    stand-in touched ``event``; its exit code and output."""
    command = [sys.executable, "-m", "miles_nemogym.cli.main", "smoke", "--episode-dir", str(root / "store")]
    process = subprocess.Popen(
        [*command, *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=root,
        start_new_session=True,
    )
    try:
        asyncio.run(eventually((root / "events" / event).exists, f"the stand-in saw {event}", limit_s=120))
        os.killpg(process.pid, signal.SIGINT)
        said, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, said


@pytest.mark.parametrize("keep", [False, True], ids=["removed", "kept"])
def test_ctrl_c_during_the_episodes_says_interrupted(tmp_path: Path, keep: bool) -> None:
    # It printed "✓ running 5 episodes ..." and "kept ... since the run failed", never "interrupted".
    code, said = _interrupted(tmp_path, stand_in_env(tmp_path, "serve"), "run", *(["--keep"] if keep else []))
    assert code == 130, said
    assert "interrupted" in said and "✓ running" not in said and "since the run failed" not in said
    made = list((tmp_path / "temp").iterdir())
    if keep:
        [folder] = made
        assert f"interrupted; what the run wrote is in {folder}" in said
        assert (folder / "smoke_prompts.jsonl").stat().st_size > 0
    else:
        assert made == []


def test_ctrl_c_while_smoke_env_starts_leaves_no_temp_folder(tmp_path: Path) -> None:
    env = stand_in_env(tmp_path, "serve")
    (Path(env["MILES_NEMOGYM_CACHE"]) / "gym-venv" / venv_key("local") / READY_MARKER).unlink()  # a first run
    events = tmp_path / "events"
    python = shell_script(
        tmp_path / "py313" / "python3.13",
        f'if [ "$1" = "-c" ]; then echo 3.13; exit 0; fi\n'  # the interpreter search's probe
        f'mkdir -p "{events}" && touch "{events}/build"\n'
        f'exec "{sys.executable}" -c "import signal; signal.pause()"',  # a build that takes its time
    )
    code, said = _interrupted(tmp_path, {**env, "MILES_NEMOGYM_GYM_PYTHON": str(python)}, "build", "--env", "mcqa")
    assert code == 130, said
    assert "interrupted" in said and "✓ creating the venv" not in said
    assert list((tmp_path / "temp").iterdir()) == []


def test_a_server_that_cannot_start_is_reported_with_its_log_as_written(tmp_path: Path) -> None:
    """Its log's tail is text: a ``[/usr/lib]`` in it once made smoke crash with Rich's MarkupError."""
    command = [sys.executable, "-m", "miles_nemogym.cli.main", "smoke", "--episode-dir", str(tmp_path / "store")]
    done = subprocess.run(
        command, env=stand_in_env(tmp_path, "exit-loud"), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert "cannot start the NeMo-Gym server:" in said and "MarkupError" not in said
    assert "cannot start [notice] [/usr/lib] (the reason" in said
