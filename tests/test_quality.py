"""The package stays ruff-clean and mypy --strict clean (a typed public API)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_lint() -> None:
    done = run(sys.executable, "-m", "ruff", "check", "src", "tests", "scripts", "bench", "examples")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format() -> None:
    done = run(sys.executable, "-m", "ruff", "format", "--check", "src", "tests", "scripts", "bench", "examples")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict() -> None:
    done = run(sys.executable, "-m", "mypy")
    assert done.returncode == 0, done.stdout + done.stderr
