"""A command's output as a real terminal shows it: run in a detached tmux pane of a given size
(its own tmux server, on a socket in a folder of the test's, removed after), captured once the
command has finished."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

TMUX = shutil.which("tmux")


@dataclass(frozen=True)
class Pane:
    shown: list[str]
    """The pane's lines as the terminal drew them, scrollback included (trailing blank lines dropped)."""
    joined: list[str]
    """The same with each line the terminal wrapped joined back: equal to ``shown`` when nothing
    ran past the pane's edge."""


def capture(commands: Sequence[Sequence[str]], width: int = 80, height: int = 24, timeout_s: float = 300) -> Pane:
    """Run ``commands`` one after the other in one ``width`` x ``height`` pane (this process's
    environment) and capture the pane with its scrollback once the last has finished."""
    assert TMUX is not None, "tmux is not installed"
    done = f"done-{uuid.uuid4().hex[:12]}"
    # -S in a folder of ours: tmux leaves its -L sockets behind in /tmp/tmux-<uid> after kill-server.
    with tempfile.TemporaryDirectory(prefix="mng-tmux-") as folder:
        tmux = [TMUX, "-S", os.path.join(folder, "socket"), "-f", os.devnull]
        ran = "; ".join(shlex.join(command) for command in commands)
        script = f"{ran}; {shlex.join([*tmux[:3], 'wait-for', '-S', done])}; sleep 600"
        try:
            subprocess.run(
                [*tmux, "start-server", ";", "set-option", "-g", "history-limit", "100000", ";",  # keep every line
                 "new-session", "-d", "-x", str(width), "-y", str(height), "sh", "-c", script],
                check=True, env={**os.environ, "TMUX": ""}, timeout=30,
            )  # fmt: skip
            subprocess.run([*tmux, "wait-for", done], check=True, timeout=timeout_s)
            shown, joined = (
                subprocess.run(
                    [*tmux, "capture-pane", "-p", "-S", "-", *flags], check=True, capture_output=True, text=True
                ).stdout
                for flags in ([], ["-J"])
            )
        finally:
            subprocess.run([*tmux, "kill-server"], capture_output=True, check=False, timeout=30)
    return Pane(_lines(shown), [line.rstrip() for line in _lines(joined)])


def _lines(text: str) -> list[str]:
    lines = text.rstrip("\n").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    return lines
