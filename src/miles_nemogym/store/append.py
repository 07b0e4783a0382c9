"""Append to a file at little CPU: whole blocks bypass the page cache, the tail does not.

Writing answers through the page cache costs the kernel far more per byte than the copy
itself (docs/episode-store.md); ``O_DIRECT`` writes of whole blocks skip it. The last
partial block is written buffered after every batch, so the file always holds every
byte written (a killed process loses nothing) and is rewritten with the next batch.
Where ``O_DIRECT`` is refused (tmpfs, some network file systems) everything is buffered.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from pathlib import Path

BLOCK = 4096
"""Alignment of offsets, lengths and memory for ``O_DIRECT`` (covers 512- and 4096-byte devices)."""
CHUNK = 4 * 1024 * 1024
"""Bytes copied per direct write: a batch streams through one reused chunk of this size."""
_IOV_MAX = 1024  # buffers per writev on Linux


def write_all(fd: int, buffers: list[bytes]) -> None:
    """Write ``buffers`` in order with as few ``writev`` calls as the kernel allows."""
    views = [memoryview(b) for b in buffers if b]
    first = 0
    while first < len(views):
        written = os.writev(fd, views[first : first + _IOV_MAX])
        while first < len(views) and written >= len(views[first]):
            written -= len(views[first])
            first += 1
        if written:  # a short write ended inside this buffer
            views[first] = views[first][written:]


def _drop_cached(fd: int) -> None:
    """Start writeback and drop written-back pages: recycled pages cost the kernel less."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


class Appender:
    """One file appended to in batches by one thread; ``close`` it before renaming the file."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._direct: int | None = None
        self._plain: int | None = None  # positioned writes of the tail (O_APPEND ignores offsets)
        self._buffer: mmap.mmap | None = None
        self._tail = b""
        size = os.fstat(self._fd).st_size
        self._base = size - size % BLOCK  # file offset of the tail's block
        if hasattr(os, "O_DIRECT"):
            try:
                self._direct = os.open(path, os.O_WRONLY | os.O_DIRECT)
                self._plain = os.open(path, os.O_WRONLY)
                with open(path, "rb") as existing:  # the partial block the next write rewrites
                    existing.seek(self._base)
                    self._tail = existing.read()
            except OSError:
                self._close_direct()

    @property
    def direct(self) -> bool:
        """Whether whole blocks bypass the page cache (False: every write is buffered)."""
        return self._direct is not None

    def write(self, buffers: list[bytes]) -> None:
        """Append ``buffers``; on return the file holds them (in the page cache at least)."""
        if self._direct is None or self._plain is None:
            write_all(self._fd, buffers)
            _drop_cached(self._fd)
            return
        view = memoryview(self._room())
        try:
            refused = self._stream(view, buffers, self._direct, self._plain)
        finally:
            view.release()
        if refused is not None:  # after all: from now on every write is buffered
            self._close_direct()
            write_all(self._fd, refused)

    def _stream(self, view: memoryview, buffers: list[bytes], direct: int, plain: int) -> list[bytes] | None:
        """Copy the tail and ``buffers`` through the chunk, writing whole blocks direct; returns
        what the file does not hold yet if a direct write is refused, else None."""
        fill = len(self._tail)
        view[:fill] = self._tail
        in_file = fill  # bytes at the start of the chunk that the file holds already
        for index, part in enumerate(buffers):
            data = memoryview(part)
            while data:
                n = min(CHUNK - fill, len(data))
                view[fill : fill + n] = data[:n]
                fill, data = fill + n, data[n:]
                if fill < CHUNK:
                    continue
                if not self._write_direct(direct, view, CHUNK):
                    return [bytes(view[in_file:fill]), bytes(data), *buffers[index + 1 :]]
                self._base += CHUNK
                fill = in_file = 0
        whole = fill - fill % BLOCK
        if whole and not self._write_direct(direct, view, whole):
            return [bytes(view[in_file:fill])]
        self._tail = bytes(view[whole:fill])
        _pwrite_all(plain, memoryview(self._tail), self._base + whole, len(self._tail))
        self._base += whole
        return None

    def _write_direct(self, direct: int, view: memoryview, length: int) -> bool:
        """Write ``view[:length]`` (whole blocks) at the tail's block; False if refused."""
        try:
            _pwrite_all(direct, view, self._base, length)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            return False
        return True

    def close(self) -> None:
        self._close_direct()
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def _room(self) -> mmap.mmap:
        """The chunk every batch is copied through: page-aligned, as ``O_DIRECT`` needs, and
        private and reused, so its pages are faulted in once."""
        if self._buffer is None:
            self._buffer = mmap.mmap(-1, CHUNK, flags=mmap.MAP_PRIVATE)
        return self._buffer

    def _close_direct(self) -> None:
        for fd in (self._direct, self._plain):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._direct = self._plain = None
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None


def _pwrite_all(fd: int, data: memoryview, offset: int, length: int) -> None:
    """Write ``data[:length]`` at ``offset``, however many calls it takes."""
    done = 0
    while done < length:
        with data[done:length] as chunk:  # released at once: the mapping may be closed next
            done += os.pwrite(fd, chunk, offset + done)
