"""The package stays ruff-clean and mypy --strict clean (a typed public API).

The ``lint`` tier: a plain ``python -m pytest`` or ``-m lint`` runs it, ``-m "not integration"`` does not.
Their caches go to the test's temporary folder, not into the tree.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREE = ("src", "tests", "scripts", "bench", "examples")

pytestmark = pytest.mark.lint


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_lint(tmp_path: Path) -> None:
    done = run(sys.executable, "-m", "ruff", "check", "--cache-dir", str(tmp_path), *TREE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format(tmp_path: Path) -> None:
    done = run(sys.executable, "-m", "ruff", "format", "--check", "--cache-dir", str(tmp_path), *TREE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict(tmp_path: Path) -> None:
    done = run(sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
