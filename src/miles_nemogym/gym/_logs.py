"""The logs ``serve`` keeps for its servers: created 0600 and never through a link, keys scrubbed.
Why and the line rule: docs/environments.md, "Servers' logs".
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from miles_nemogym.errors import scrub_all
from miles_nemogym.gym.composition import JUDGE_KEY_ENV, POLICY_KEY_ENV
from miles_nemogym.gym.venv import GymEnvironmentError

__all__ = ["ServerLog", "log_tail", "open_private", "run_secrets"]

_LINE_LIMIT = 1 << 20
"""A line longer than this is written in parts (all but the last ``_HELD`` bytes, scrubbed)."""
_HELD = 64 << 10
"""More than any encoding of a key (a key's forms are a few bytes per character)."""


def run_secrets(*urls: str | None) -> list[str]:
    """What ``serve``'s logs must never hold: the policy and judge keys, and the passwords in ``urls``."""
    found = [os.environ.get(POLICY_KEY_ENV), os.environ.get(JUDGE_KEY_ENV)]
    for url in urls:
        with contextlib.suppress(ValueError):
            found.append(urlsplit(url).password if url else None)
    return [secret for secret in dict.fromkeys(found) if secret]


def log_tail(path: Path, lines: int = 40) -> str:
    """``path``, then its last ``lines`` lines (or that there is no log)."""
    try:
        return f"{path}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"{path}: (no log)"


def open_private(path: Path) -> int:
    """``path`` opened to append, created 0600, never through a link; ``GymEnvironmentError`` names it if not."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise GymEnvironmentError(
                f"log {path} is a symbolic link, which serve never writes through; "
                "remove it or give another --state-dir"
            ) from None
        raise GymEnvironmentError(f"cannot write log {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GymEnvironmentError(f"log {path} is not a regular file; remove it or give another --state-dir")
    os.fchmod(fd, 0o600)  # a log an earlier version left readable to all
    return fd


class ServerLog:
    """One server's log: :attr:`child_end` is the process's stdout and stderr; :meth:`started`, then :meth:`close`."""

    def __init__(self, path: Path, secrets: Iterable[str]) -> None:
        self.path = path
        self._scrub = scrub_all(secrets)
        self._file = open_private(path)
        self._read_end, self.child_end = os.pipe()
        self._thread = threading.Thread(target=self._copy, name=f"log {path.name}", daemon=True)
        self._thread.start()

    def started(self) -> None:
        """The child holds its copy of the pipe: this process's is closed, so the log ends when the child does."""
        if self.child_end >= 0:
            os.close(self.child_end)
            self.child_end = -1

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._file, view) :]

    def _copy(self) -> None:
        held = b""
        try:
            while chunk := os.read(self._read_end, 1 << 16):
                held += chunk
                cut = held.rfind(b"\n") + 1  # a key never spans a line: whole lines are safe to scrub
                if cut:
                    self._write(self._scrub(held[:cut]))
                    held = held[cut:]
                if len(held) > _LINE_LIMIT:
                    # Scrubbed first: a key cut off at the end is shorter than what stays held.
                    held = self._scrub(held)
                    self._write(held[:-_HELD])
                    held = held[-_HELD:]
            self._write(self._scrub(held))
        except OSError:
            pass  # the log's disk is full or gone: the server keeps running, its output is dropped
        finally:
            os.close(self._read_end)
            os.close(self._file)

    def close(self, timeout: float = 5.0) -> None:
        """Wait until what the server wrote is in the log (at most ``timeout``: a child it left may hold the pipe)."""
        self.started()
        self._thread.join(timeout)
