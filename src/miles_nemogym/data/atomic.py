"""Output files that appear at their paths all together, or not at all.

Each file of an :class:`AtomicFiles` set is written to a temporary file beside its path.
:meth:`AtomicFiles.commit` flushes, fsyncs and closes every one, then renames them in one
short step during which Ctrl-C and SIGTERM wait, so an interrupt lands before it (nothing
touched) or after it (everything written). Any failure removes every temporary file and the
folders the set made. Why: docs/data-and-checks.md, "Atomic output".
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, BinaryIO

from miles_nemogym.errors import MilesNemoGymError

__all__ = [
    "AtomicFile",
    "AtomicFiles",
    "InterruptedAfterCommit",
    "TempFile",
    "WriteError",
    "output_problem",
    "write_file",
]

_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class WriteError(MilesNemoGymError, OSError):
    """A file could not be written or moved into place; the message names it and the OS reason."""


class InterruptedAfterCommit(MilesNemoGymError, KeyboardInterrupt):
    """Ctrl-C or SIGTERM arrived while the files were moved into place: every one of them was
    (``except KeyboardInterrupt`` catches it, as any Ctrl-C)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        super().__init__(", ".join(map(str, paths)))
        self.paths = tuple(paths)


def output_problem(path: Path) -> str | None:
    """Why ``path`` cannot be an output: the rename would replace a link, a folder or a device."""
    if path.is_symlink():
        return (
            "is a symbolic link; the output would replace the link itself, not write through it: "
            f"give its target ({path.resolve()}) or a new path"
        )
    if path.is_dir():
        return "is a folder; name a file"
    if path.exists() and not path.is_file():
        return "is not a regular file (a device, pipe or socket), which the output would replace; give a file path"
    return None


def write_file(path: Path, data: bytes) -> None:
    """``data`` at ``path`` as a new file moved over the old one (never through a link); :class:`WriteError` if not."""
    with AtomicFiles() as files:
        files.open(path).write(data)
        files.commit()


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


class TempFile:
    """A temporary file beside ``near`` (at ``temp_path``); write errors name ``label``."""

    def __init__(self, near: Path, suffix: str, label: str) -> None:
        self.label = label
        try:
            fd, temp = tempfile.mkstemp(dir=near.parent, prefix=f".{near.name}.", suffix=suffix)
        except OSError as error:
            raise WriteError(f"cannot write {label}: {_reason(error)}") from None
        self.temp_path = Path(temp)
        self.handle: BinaryIO = os.fdopen(fd, "wb", buffering=1 << 20)

    def write(self, data: bytes) -> None:
        try:
            self.handle.write(data)
        except OSError as error:
            raise WriteError(f"cannot write {self.label}: {_reason(error)}") from None

    def flush(self) -> None:
        try:
            self.handle.flush()
        except OSError as error:
            raise WriteError(f"cannot write {self.label}: {_reason(error)}") from None

    def remove(self) -> None:
        """Close (its unwritten data is dropped) and delete; never raises."""
        with contextlib.suppress(OSError):
            self.handle.close()  # a failing flush still closes the file descriptor
        with contextlib.suppress(OSError):
            self.temp_path.unlink(missing_ok=True)


class AtomicFile(TempFile):
    """One file of a set: written to a temporary file, at ``path`` once the set is committed."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, ".tmp", str(path))
        self.path = path

    def _finish(self) -> None:
        """Everything on disk and the file closed, with the usual permissions (mkstemp makes 0600)."""
        try:
            self.handle.flush()
            os.fsync(self.handle.fileno())
            os.fchmod(self.handle.fileno(), 0o666 & ~_umask())
            self.handle.close()
        except OSError as error:
            raise WriteError(f"cannot write {self.path}: {_reason(error)}") from None


class AtomicFiles:
    """Files committed together or not at all (``with AtomicFiles() as files``: leaving the block
    without :meth:`commit` removes them). :meth:`scratch` files (a spool) are always removed."""

    def __init__(self) -> None:
        self._files: list[AtomicFile] = []
        self._scratch: list[TempFile] = []
        self._made_folders: list[Path] = []
        self.committed = False

    @property
    def paths(self) -> tuple[Path, ...]:
        """The paths the set writes, in the order they were opened."""
        return tuple(file.path for file in self._files)

    def _folder_for(self, path: Path, label: str) -> None:
        missing = [folder for folder in (path.parent, *path.parent.parents) if not os.path.lexists(folder)]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError as error:
            raise WriteError(f"cannot write {label}: {error.filename} is not a folder") from None
        except OSError as error:
            raise WriteError(f"cannot write {label}: cannot make folder {error.filename}: {_reason(error)}") from None
        self._made_folders.extend(missing)

    def open(self, path: Path) -> AtomicFile:
        """A new member at ``path`` (its folder made if missing); :class:`WriteError` if ``path``
        is a link, a folder or a device, or cannot be written."""
        problem = output_problem(path)
        if problem:
            raise WriteError(f"cannot write {path}: it {problem}")
        self._folder_for(path, str(path))
        file = AtomicFile(path)
        self._files.append(file)
        return file

    def scratch(self, near: Path, label: str) -> TempFile:
        """A temporary file beside ``near``, removed with the set (committed or not); a write
        error names ``label``."""
        self._folder_for(near, label)
        temporary = TempFile(near, ".spool.tmp", label)
        self._scratch.append(temporary)
        return temporary

    def commit(self) -> None:
        """Finish every file, then move them all into place, in the reverse order they were opened
        (the first one last). :class:`WriteError` names the file that failed, and which were moved
        if any were; :class:`InterruptedAfterCommit` if a signal waited for the moves."""
        if self.committed:
            return
        for file in self._files:
            file._finish()
        with _held_signals() as held:
            moved: list[Path] = []
            for file in reversed(self._files):
                try:
                    os.replace(file.temp_path, file.path)
                except OSError as error:
                    done = f"; already moved into place: {', '.join(map(str, moved))}" if moved else ""
                    raise WriteError(f"cannot move {file.path} into place: {_reason(error)}{done}") from None
                moved.append(file.path)
            self.committed = True
            for folder in {file.path.parent for file in self._files}:
                _fsync_folder(folder)  # the renames survive a power loss
            self._remove_scratch()
        _deliver(held, self.paths)

    def discard(self) -> None:
        """Remove every temporary file and, unless committed, the folders the set made; never
        raises (one failing file does not stop the others). No-op once committed."""
        with _held_signals() as held:
            self._remove_scratch()
            if not self.committed:
                for file in self._files:
                    file.remove()
                self._files.clear()
                for folder in sorted(set(self._made_folders), key=lambda folder: len(folder.parts), reverse=True):
                    with contextlib.suppress(OSError):
                        folder.rmdir()  # only if empty: anything else put there stays
                self._made_folders.clear()
        _deliver(held, self.paths if self.committed else ())

    def _remove_scratch(self) -> None:
        for temporary in self._scratch:
            temporary.remove()
        self._scratch.clear()

    def __enter__(self) -> AtomicFiles:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Discard; a Ctrl-C that lands just after the commit becomes :class:`InterruptedAfterCommit`."""
        self.discard()
        if self.committed and isinstance(exc, KeyboardInterrupt) and not isinstance(exc, InterruptedAfterCommit):
            raise InterruptedAfterCommit(self.paths) from None


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system lets a folder be opened or synced
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _held_signals() -> Iterator[list[int]]:
    """Inside, SIGINT and SIGTERM wait (they are recorded); the previous handlers come back on
    leaving. Signals left ignored stay ignored; off the main thread nothing changes."""
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    previous: dict[int, Any] = {}
    try:
        for signum in _HELD_SIGNALS:
            handler = signal.getsignal(signum)
            if handler is not None and handler != signal.SIG_IGN:  # None: set outside Python, left alone
                previous[signum] = signal.signal(signum, hold)
    except ValueError:  # not the main thread: signals reach the main thread only
        pass
    try:
        yield held
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _deliver(held: list[int], written: Sequence[Path]) -> None:
    """Raise the first held signal now, with its own handler; after a commit its
    ``KeyboardInterrupt`` becomes :class:`InterruptedAfterCommit`."""
    if not held:
        return
    try:
        signal.raise_signal(held[0])
    except KeyboardInterrupt:
        if written:
            raise InterruptedAfterCommit(written) from None
        raise
