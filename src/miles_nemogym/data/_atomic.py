"""Output files that appear at their paths all together, or not at all: written beside them, renamed in one
short step Ctrl-C and SIGTERM wait for (docs/data-and-checks.md, "Atomic output")."""

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

__all__ = ["AtomicFiles", "InterruptedAfterCommit", "WriteError", "output_problem", "write_file"]


class WriteError(MilesNemoGymError, OSError):
    """A file could not be written or moved into place; the message names it and the OS reason."""


class InterruptedAfterCommit(MilesNemoGymError, KeyboardInterrupt):
    """Ctrl-C or SIGTERM arrived while the files were moved into place, and every one of them was."""

    def __init__(self, paths: Sequence[Path]) -> None:
        super().__init__(", ".join(map(str, paths)))
        self.paths = tuple(paths)


def output_problem(path: Path) -> str | None:
    """Why ``path`` cannot be an output: the rename would replace a link, a folder or a device."""
    if path.is_symlink():
        try:
            fix = f"give its target ({path.resolve()}) or a new path"
        except (RuntimeError, OSError):  # a link loop: resolve() raises (RuntimeError up to 3.12)
            fix = "it points back to itself: remove it or give a new path"
        return f"is a symbolic link; the output would replace the link itself, not write through it: {fix}"
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


@contextlib.contextmanager
def _writing(label: str) -> Iterator[None]:
    try:
        yield
    except OSError as error:
        raise WriteError(f"cannot write {label}: {error.strerror or error}") from None


class AtomicFile:
    """A temporary file beside ``path``: a member of a set (at ``path`` once the set is committed),
    or a scratch file (removed with the set); write errors name ``label``."""

    def __init__(self, path: Path, suffix: str = ".tmp", label: str | None = None) -> None:
        self.path, self.label = path, label or str(path)
        with _writing(self.label):
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
        self.temp_path = Path(temp)
        self.handle: BinaryIO = os.fdopen(fd, "wb", buffering=1 << 20)

    def write(self, data: bytes) -> None:
        with _writing(self.label):
            self.handle.write(data)

    def flush(self) -> None:
        with _writing(self.label):
            self.handle.flush()

    def _finish(self) -> None:
        """Everything on disk and the file closed, with the usual permissions (mkstemp makes 0600)."""
        umask = os.umask(0)
        os.umask(umask)
        with _writing(self.label):
            self.handle.flush()
            os.fsync(self.handle.fileno())
            os.fchmod(self.handle.fileno(), 0o666 & ~umask)
            self.handle.close()

    def remove(self) -> None:
        """Close (its unwritten data is dropped) and delete; never raises."""
        with contextlib.suppress(OSError):
            self.handle.close()  # a failing flush still closes the file descriptor
        with contextlib.suppress(OSError):
            self.temp_path.unlink(missing_ok=True)


class AtomicFiles(contextlib.AbstractContextManager["AtomicFiles"]):
    """Files committed together or not at all (``with AtomicFiles() as files``: leaving the block
    without :meth:`commit` removes them). :meth:`scratch` files (a spool) are always removed."""

    def __init__(self) -> None:
        self._files: list[AtomicFile] = []
        self._scratch: list[AtomicFile] = []
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
            raise WriteError(
                f"cannot write {label}: cannot make folder {error.filename}: {error.strerror or error}"
            ) from None
        self._made_folders.extend(missing)

    def open(self, path: Path) -> AtomicFile:
        """A new member at ``path`` (its folder made if missing); :class:`WriteError` if it cannot be one."""
        problem = output_problem(path)
        if problem:
            raise WriteError(f"cannot write {path}: it {problem}")
        self._folder_for(path, str(path))
        self._files.append(AtomicFile(path))
        return self._files[-1]

    def scratch(self, near: Path, label: str) -> AtomicFile:
        """A temporary file beside ``near``, removed with the set (committed or not)."""
        self._folder_for(near, label)
        self._scratch.append(AtomicFile(near, ".spool.tmp", label))
        return self._scratch[-1]

    def commit(self) -> None:
        """Finish every file, then move them all into place, the first one opened last (:class:`WriteError`
        names the file that failed and those already moved)."""
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
                    raise WriteError(f"cannot move {file.path} into place: {error.strerror or error}{done}") from None
                moved.append(file.path)
            self.committed = True
            for folder in {file.path.parent for file in self._files}:
                with contextlib.suppress(OSError):  # the renames survive a power loss, where the FS allows
                    fd = os.open(folder, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            self._remove_scratch()
        _deliver(held, self.paths)

    def discard(self) -> None:
        """Remove every temporary file and, unless committed, the folders the set made; never raises."""
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

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        """Discard; a Ctrl-C that lands just after the commit becomes :class:`InterruptedAfterCommit`."""
        self.discard()
        if self.committed and isinstance(exc, KeyboardInterrupt) and not isinstance(exc, InterruptedAfterCommit):
            raise InterruptedAfterCommit(self.paths) from None


@contextlib.contextmanager
def _held_signals() -> Iterator[list[int]]:
    """Inside, SIGINT and SIGTERM wait (recorded); ignored or non-Python handlers and other threads are left alone."""
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    previous: dict[int, Any] = {}
    with contextlib.suppress(ValueError):  # not the main thread: signals reach the main thread only
        for signum in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(signum)
            if handler is not None and handler != signal.SIG_IGN:
                previous[signum] = signal.signal(signum, hold)
    try:
        yield held
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _deliver(held: list[int], written: Sequence[Path]) -> None:
    """Raise the first held signal with its own handler (after a commit: :class:`InterruptedAfterCommit`)."""
    if not held:
        return
    try:
        signal.raise_signal(held[0])
    except KeyboardInterrupt:
        if written:
            raise InterruptedAfterCommit(written) from None
        raise
