"""The real CLI in a child process under resource limits: a file-size limit stands in for a full
disk (both fail a write with an OS error), a memory limit for a small machine."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path


def run_limited(
    *args: str | Path, file_size: int | None = None, memory: int | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``miles-nemogym ARGS`` with its files limited to ``file_size`` bytes (a write past it fails with
    EFBIG, SIGXFSZ being ignored) and its address space to ``memory`` bytes."""

    def limit() -> None:
        if file_size is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run(
        [sys.executable, "-m", "miles_nemogym.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
    )
