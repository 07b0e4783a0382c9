"""Write a file so that its path holds either the old content or the complete new one.

The converter's output edge: a temporary file in the same folder, ``os.replace``d over
the target only on :meth:`AtomicFile.commit` (docs/data-and-checks.md).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import TracebackType


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


class AtomicFile:
    """A binary file that appears at ``path`` only when committed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        self.temp_path = Path(temp)
        self._handle = os.fdopen(fd, "wb", buffering=1 << 20)
        self._done = False

    def write(self, data: bytes) -> None:
        self._handle.write(data)

    def commit(self) -> None:
        if self._done:
            return
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        # mkstemp makes 0600 files; an output file should get the usual permissions.
        os.chmod(self.temp_path, 0o666 & ~_umask())
        os.replace(self.temp_path, self.path)
        self._done = True

    def discard(self) -> None:
        if self._done:
            return
        self._done = True
        self._handle.close()
        self.temp_path.unlink(missing_ok=True)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Committing is always explicit: leaving the block without commit() discards.
        self.discard()
