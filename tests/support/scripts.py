"""Executable stand-ins (a fake interpreter, a fake CLI) written into a test's folder."""

from __future__ import annotations

import stat
from pathlib import Path


def shell_script(path: Path, body: str) -> Path:
    """``path`` as an executable ``/bin/sh`` script running ``body``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path
