"""``miles-nemogym serve`` as a child process, read until it has printed the settings and waits for Ctrl-C."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Serving:
    process: subprocess.Popen[str]
    printed: str
    """What serve printed up to its ``Press Ctrl-C to stop.`` line (the ``export`` lines above it)."""

    def stop(self) -> str:
        """SIGTERM, as Ctrl-C or a job scheduler would; returns what serve printed after ``printed``."""
        self.process.send_signal(signal.SIGTERM)
        rest, _ = self.process.communicate(timeout=120)
        return rest


@contextmanager
def serving(*arguments: str, env: Mapping[str, str] | None = None) -> Iterator[Serving]:
    """``serve ARGUMENTS`` started (in ``env``, default this process's environment) and ready (or
    exited: ``printed`` says why); killed on exit if still running."""
    command = [sys.executable, "-m", "miles_nemogym.cli.main", "serve", *arguments]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(env) if env else None
    )
    try:
        assert process.stdout is not None
        seen: list[str] = []
        for line in process.stdout:
            seen.append(line)
            if line.startswith("Press Ctrl-C to stop."):
                break
        yield Serving(process, "".join(seen))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def exported(printed: str) -> dict[str, str]:
    """The ``export NAME=VALUE`` lines serve printed, as the shell would read them."""
    found = {}
    for line in printed.splitlines():
        if line.strip().startswith("export "):
            words = shlex.split(line)
            assert len(words) == 2, line  # one shell word per value: pasted as is
            name, _, value = words[1].partition("=")
            found[name] = value
    return found


@contextmanager
def serving_environments(envs: Sequence[str], state_dir: Path, judge_url: str) -> Iterator[dict[str, Any]]:
    """``NEMO_GYM_ENVS`` as ONE ``serve --no-swe --env ...`` start of ``envs`` printed it, their
    judges at ``judge_url`` (model ``judge``); stopped after, its clean exit checked."""
    envs_args = [f"--env={e}" for e in envs]
    arguments = ["--no-swe", "--port", "0", "--state-dir", str(state_dir), *envs_args, "--judge-url", judge_url]
    with serving(*arguments, "--judge-model", "judge", env={**os.environ, "HF_HUB_OFFLINE": "1"}) as serve:
        printed = exported(serve.printed)
        assert "NEMO_GYM_ENVS" in printed, serve.printed
        yield json.loads(printed["NEMO_GYM_ENVS"])
        rest = serve.stop()
    assert serve.process.returncode == 0, rest
