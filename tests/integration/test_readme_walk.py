"""README's commands, then docs/environments.md's, run as written and in order, as a new user
would: a fresh virtual environment, ``pip install`` from the repository, every other command in a
working folder of its own. The one change is what this machine lacks: no Docker engine, so
``serve --sandbox docker`` runs with ``--sandbox local`` (and ``--port 0``: CI shares its ports).
A ``serve`` stays up, its printed exports set for the commands after it, until the next one."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.readme import ENVIRONMENTS_DOC, README, bash_commands, section_commands

pytestmark = pytest.mark.integration

_NO_DOCKER = {"docker": "local"}
"""The sandbox this machine can start instead of the one the docs name."""
_READY = "Press Ctrl-C to stop."


def test_readme_quick_start_is_two_commands() -> None:
    assert section_commands("Quick start") == ["pip install -e '.[cli]'", "miles-nemogym smoke"]


class _Serve:
    """One ``serve`` of the walk, in the background until the next one (or the end)."""

    def __init__(self, words: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
        self.words, self.log = words, log
        with log.open("w") as out:
            self.process = subprocess.Popen(
                words, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def exports(self, timeout_s: float = 900) -> dict[str, str]:
        """The variables it says to export, once it is ready."""
        deadline = time.monotonic() + timeout_s
        while _READY not in self.log.read_text():
            assert self.process.poll() is None, f"{shlex.join(self.words)} exited:\n{self.log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"{shlex.join(self.words)} not ready:\n{self.log.read_text()[-4000:]}"
            time.sleep(1)
        found = {}
        for line in self.log.read_text().splitlines():
            words = shlex.split(line) if line.strip().startswith("export ") else []
            if len(words) == 2:
                name, _, value = words[1].partition("=")
                found[name] = value
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # what Ctrl-C does: serve stops its servers
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.mark.timeout(2400)
def test_every_command_of_readme_and_the_environments_doc_runs_as_written(tmp_path: Path) -> None:
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("NEMO_GYM")
    }
    env.update({"VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"})
    # The store (README: --episode-dir, else NEMO_GYM_EPISODE_DIR, else ./miles-nemogym-smoke-episodes)
    # goes to a short folder of the test's (the closing hint quotes the path).
    store = Path(tempfile.mkdtemp(prefix="walk-")) / "episodes"
    env["NEMO_GYM_EPISODE_DIR"] = str(store)
    commands = [*bash_commands(README), *bash_commands(ENVIRONMENTS_DOC)]
    outputs: dict[str, str] = {}
    serve: _Serve | None = None
    try:
        for where, words in commands:
            if words[:2] == ["miles-nemogym", "serve"]:
                if serve is not None and serve.words[: len(words)] == words:
                    continue  # the same server as the one up: the docs repeat README's command
                if serve is not None:
                    serve.stop()
                ran = [
                    _NO_DOCKER.get(word, word) if before == "--sandbox" else word
                    for before, word in zip(["", *words[:-1]], words, strict=True)
                ]
                serve = _Serve([*ran, "--port", "0"], work, env, tmp_path / f"serve-{len(outputs)}.log")
                env.update(serve.exports())
                outputs[shlex.join(words)] = serve.log.read_text()
                continue
            cwd = README.parent if words[0] == "pip" else work
            done = subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
            assert done.returncode == 0, (
                f"{where}: {shlex.join(words)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
            outputs[shlex.join(words)] = done.stdout
        if serve is not None:
            serve.stop()
            assert serve.process.returncode == 0, serve.log.read_text()[-3000:]
    finally:
        if serve is not None:
            serve.stop()

    smoke = outputs["miles-nemogym smoke"]
    assert "smoke: one row per episode" in smoke and "scikit-learn__scikit-learn-14141" in smoke
    # 80 columns, but a path longer than that stands whole on a line of its own (and the command to copy)
    wide = [line for line in smoke.splitlines() if len(line) > 80 and len(line.split()) > 1]
    assert [line for line in wide if not line.startswith("  miles-nemogym episodes ")] == [], wide
    hint = smoke.splitlines()[-1].split()
    assert hint == ["miles-nemogym", "episodes", str(store)]  # absolute, and it browses what smoke stored
    browsed = subprocess.run(hint, env=env, capture_output=True, text=True, timeout=300)
    assert browsed.returncode == 0 and "train" in browsed.stdout, browsed.stdout + browsed.stderr

    served = outputs["miles-nemogym serve --sandbox docker --env mcqa --env workplace_assistant"]
    # README's no-Docker line is the server that ran for the docker one, as written.
    assert ["miles-nemogym", "serve", "--sandbox", "local", "--env", "mcqa", "--env", "workplace_assistant"] in [
        words for _, words in commands
    ]
    assert "mini_swe_agent_2 is serving (local sandbox" in " ".join(served.split())
    assert "mcqa" in env["NEMO_GYM_ENVS"] and "xlam_fc" in env["NEMO_GYM_ENVS"]  # the last serve's
    assert len((work / "train.jsonl").read_text().splitlines()) == 1000
    assert sorted(path.name for path in (work / "eval").iterdir()) == [
        "mcqa.jsonl",
        "swe.jsonl",
        "workplace_assistant.jsonl",
    ]
    assert "reward 1.0 (wrong 0.0)" in outputs["miles-nemogym scan --input eval/mcqa.jsonl --golden"]
    shutil.rmtree(store.parent)
