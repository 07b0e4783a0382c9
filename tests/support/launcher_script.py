"""Run the example launcher script as users do: a separate interpreter, from the repo root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "examples" / "swebench_grpo" / "run.py"


def run_launcher(*args: str) -> subprocess.CompletedProcess[str]:
    """``python examples/swebench_grpo/run.py ARGS``; the caller checks the exit code."""
    return subprocess.run(
        [sys.executable, str(LAUNCHER), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
