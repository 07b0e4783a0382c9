"""Without GitHub access the test session says once what to do, and no error is printed twice.

A pytest session is run in a subprocess with no ``MILES_SRC``/``MEGATRON_SRC``, a fresh cache
and a ``git`` that fails as git does without network (exit 128, "Could not resolve host"):
four tests need Miles' environment or Megatron-LM's source through ``env_or_fail``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from miles_nemogym.pins import MEGATRON_COMMIT, MEGATRON_REPOSITORY, MILES_COMMIT, MILES_REPOSITORY

SESSION = """
import sys
from pathlib import Path

import pytest

from tests.support.miles_env import MilesEnv, ensure_miles_env, megatron_source
from tests.support.miles_harness import env_or_fail


@pytest.fixture(scope="session")
def miles(request):
    return env_or_fail(request, "miles-env", ensure_miles_env)


@pytest.fixture(scope="session")
def megatron(request):
    return env_or_fail(request, "megatron", lambda: MilesEnv(Path(sys.executable), megatron_source()))


def test_one(miles): pass
def test_two(miles): pass
def test_three(megatron): pass
def test_four(megatron): pass
"""

# git's own words and exit code for a clone without network.
REPO_ROOT = Path(__file__).resolve().parents[1]

OFFLINE_GIT = """#!/bin/sh
echo "fatal: unable to access 'https://github.com/': Could not resolve host: github.com" >&2
exit 128
"""


def test_without_sources_or_network_each_fix_is_said_once(tmp_path: Path) -> None:
    (tmp_path / "test_session.py").write_text(SESSION)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "git").write_text(OFFLINE_GIT)
    (tools / "git").chmod(0o755)
    # As on a developer's machine: without the sources, and without CI's variables (under CI=true
    # pytest prints its short summary uncut, a third copy of each test's line).
    unset = ("MILES_SRC", "MEGATRON_SRC", "CI", "BUILD_NUMBER")
    env = {name: value for name, value in os.environ.items() if name not in unset}
    env["PATH"] = f"{tools}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)])
    env["MILES_NEMOGYM_CACHE"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "test_session.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "4 errors" in output, output
    for name, variable, repository, commit in (
        ("miles-env", "MILES_SRC", MILES_REPOSITORY, MILES_COMMIT),
        ("megatron", "MEGATRON_SRC", MEGATRON_REPOSITORY, MEGATRON_COMMIT),
    ):
        line = (
            f"[{name}] unavailable for this test session: no {'Miles' if name == 'miles-env' else 'Megatron-LM'} "
            f"source: cloning {repository} failed (fatal: unable to access 'https://github.com/': Could not "
            f"resolve host: github.com); set {variable} to a checkout or a .tar.gz of {repository} at "
            f"{commit[:12]}, or give this machine access to {repository}."
        )
        assert output.count(line) == 1, output
        # Each test's error is that one short line (the summary's copy is cut short).
        assert output.count(f"{name} unavailable: the [{name}] line printed on the terminal says why") == 2, output
    assert "During handling" not in output and "Traceback" not in output, output
    assert output.count("Could not resolve host") == 2, output  # once per source, in its line
