"""Run Python as a user whom file permissions bind, even when the tests run as root.

Root ignores permission bits (``CAP_DAC_OVERRIDE``), so a folder without write permission
only refuses a process without that capability: as root, the child drops it (and
``CAP_DAC_READ_SEARCH``) from its bounding set, then re-executes Python, which leaves it
without them, exactly as an ordinary user runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE = 1
_CAP_DAC_READ_SEARCH = 2

_DROP_THEN_EXEC = f"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for cap in ({_CAP_DAC_OVERRIDE}, {_CAP_DAC_READ_SEARCH}):
    if libc.prctl({_PR_CAPBSET_DROP}, cap, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""


def run_python_unprivileged(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in ``cwd`` without the capabilities that bypass permission bits."""
    argv = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        argv = [sys.executable, "-c", _DROP_THEN_EXEC, code]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
