"""The episode store's writing side: one writer thread per folder appends each episode to
``<role>/pending-<file id>.jsonl`` and seals steps. Layout and guarantees: docs/episode-store.md."""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import queue
import secrets
import stat
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic_core

from miles_nemogym.episode.record import EVAL, TRAIN, EpisodeRecord

__all__ = ["ROLES"]

logger = logging.getLogger(__name__)

ROLES = (TRAIN, EVAL)
"""The roles an episode is stored under (``store._plots`` unpacks them: train first)."""
MAX_PENDING_BYTES = 256 * 1024 * 1024  # raw answers queued, at most; past it an episode is kept without one
_MAX_HEADS_BYTES = 32 * 1024 * 1024  # heads held per file, at most; past it the step gets no .heads file
_COMPRESS_LEVEL = 1  # zlib level 1: ~4x smaller on trajectories at a fraction of level 6's CPU
_FILE_MODE = 0o600  # owner-only; the umask can take bits away, never add them
_DIR_MODE = 0o700
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _line(head: bytes, answer: bytes | None, answer_is_json: bool) -> bytes:
    """One store line: ``head``'s fields, then ``answer`` (last, so a line reads head first)."""
    value = b"null" if answer is None else answer  # a JSON answer on one line: inlined byte for byte
    if answer is not None and (not answer_is_json or b"\n" in answer or b"\r" in answer):
        value = b""
        if answer_is_json:  # with line breaks: re-encoded compactly
            with contextlib.suppress(ValueError):
                value = json.dumps(json.loads(answer), separators=(",", ":")).encode()
        value = value or json.dumps({"text": answer.decode("utf-8", "replace")}).encode()  # not JSON: as text
    return head[:-1] + (b',"answer":' if head != b"{}" else b'"answer":') + value + b"}\n"


@dataclass
class _Request:
    """A seal of ``role``'s files under ``step`` (``trained``: fully async's filing), or a flush (no role)."""

    role: str
    step: int
    trained: list[str] | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _File:
    """One file this writer created and appends to; ``heads`` are its lines' heads, in order."""

    file_id: str
    fd: int | None
    size: int = 0
    heads: list[bytes] | None = field(default_factory=list)
    heads_bytes: int = 0

    @property
    def name(self) -> str:
        return f"pending-{self.file_id}.jsonl"


@dataclass
class _Role:
    """A role's folder (opened without following links) and its files not yet sealed."""

    dir_fd: int
    path: Path
    files: list[_File] = field(default_factory=list)
    not_trained: list[tuple[str, str]] = field(default_factory=list)  # (episode id, reason) since the last filing


class EpisodeStore:
    """One folder's store for this process: ``add`` queues, one writer thread writes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # In every file name it creates: a restarted process never appends to a file an earlier one left.
        self.writer_id = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.answers_dropped = 0
        self.lines_written = 0
        self.write_errors = 0
        # None stops the writer; a function (writing an episode, noting dropped ones) runs on its thread.
        self._queue: queue.SimpleQueue[_Request | Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._warned: set[str] = set()  # the kinds of write error warned about (each once)
        self._pending_bytes = 0
        self._files_made = 0
        self._roles: dict[str, _Role] = {}  # the writer thread's only
        self._thread = threading.Thread(target=self._work, name="nemogym-episode-store", daemon=True)
        self._thread.start()

    def add(
        self,
        role: str,
        entry: dict[str, Any],
        answer: bytes | None,
        answer_is_json: bool,
        scrub: Callable[[bytes], bytes] | None = None,
    ) -> None:
        """Queue one finished episode; never blocks, never raises (``scrub`` runs on the writer thread)."""
        try:
            # Encoded now (the record may change once this returns); non-finite numbers as null: strict JSON.
            head = pydantic_core.to_json(entry, inf_nan_mode="null")
            size = len(answer) if answer else 0
            with self._lock:
                dropped = size > 0 and self._pending_bytes + size > MAX_PENDING_BYTES
                if dropped:
                    self.answers_dropped += 1
                else:
                    self._pending_bytes += size
            if dropped:
                entry = {**entry, "answer_dropped": "the store's writer was behind; raw answer not kept"}
                head, answer = pydantic_core.to_json(entry, inf_nan_mode="null"), None
            self._queue.put(functools.partial(self._write, role, head, answer, answer_is_json, scrub))
        except Exception as error:  # an entry that cannot be encoded: the sample is unaffected
            self.write_errors += 1
            self._warn(type(error).__name__, f"an episode could not be encoded ({error})")

    def seal(self, role: str, step: int, timeout_s: float = 30.0, trained: list[str] | None = None) -> None:
        """File ``role``'s episodes queued so far under ``step``, once renamed (``trained``: the filing too)."""
        if not self._request(_Request(role, step, trained), timeout_s):
            logger.warning("episode store: sealing %s step %d is still running after %.0fs", role, step, timeout_s)

    def not_trained(self, role: str, episode_ids: list[str], reason: str) -> None:
        """Queue ``episode_ids`` as not trained for ``reason``, noted in the next filing; never raises."""
        noted = [(episode_id, reason) for episode_id in episode_ids]
        self._queue.put(lambda: self._role(role).not_trained.extend(noted))

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until everything queued so far is written (and sealed steps compressed)."""
        self._request(_Request("", -1), timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued and stop the writer thread; its files stay pending."""
        self.flush(timeout_s)
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _request(self, request: _Request, timeout_s: float) -> bool:
        if not self._thread.is_alive():
            return True
        self._queue.put(request)
        return request.done.wait(timeout_s)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                for role in self._roles.values():
                    for file in role.files:
                        _close(file)
                    os.close(role.dir_fd)
                self._roles.clear()
                return
            try:
                if not isinstance(item, _Request):
                    item()
                elif item.role:
                    self._seal(item)
            except Exception as error:  # the store must never take the rollout down
                self.write_errors += 1
                if isinstance(item, _Request):
                    self._warn(f"seal {type(error).__name__}", f"sealing step {item.step} failed: {error}")
                else:
                    self._warn(f"filing {type(error).__name__}", f"dropped episodes could not be noted: {error}")
            finally:
                if isinstance(item, _Request):
                    item.done.set()

    def _write(
        self, name: str, head: bytes, raw: bytes | None, answer_is_json: bool, scrub: Callable[[bytes], bytes] | None
    ) -> None:
        if raw:
            with self._lock:
                self._pending_bytes -= len(raw)
        try:
            line = _line(head, scrub(raw) if scrub and raw else raw, answer_is_json)
            role = self._role(name)
            if not role.files or role.files[-1].fd is None:  # none yet, or the last closed: a new file
                self._files_made += 1
                new = _File(f"{self.writer_id}-{self._files_made}", None)
                new.fd = _open_no_link(new.name, _NEW_FILE | os.O_APPEND, _FILE_MODE, role.dir_fd, role.path)
                role.files.append(new)
            file = role.files[-1]
            assert file.fd is not None
            try:
                _write_all(file.fd, line)
            except OSError:  # never append after a partial line: cut back to the last whole one, else a new file
                try:
                    os.ftruncate(file.fd, file.size)
                except OSError:
                    _close(file)
                raise
            file.size += len(line)
            if file.heads is not None:
                file.heads.append(head + b"\n")
                file.heads_bytes += len(head) + 1
                if file.heads_bytes > _MAX_HEADS_BYTES:  # never sealed? memory stays bounded
                    file.heads = None
            self.lines_written += 1
        except Exception as error:  # the store must never take the rollout down
            self.write_errors += 1
            self._warn(
                f"write {type(error).__name__} {getattr(error, 'errno', '')}",
                f"an episode was not saved in {self.directory} ({error}); training goes on, the samples are unaffected",
            )

    def _role(self, name: str) -> _Role:
        role = self._roles.get(name)
        if role is not None:
            return role
        # The folder the user named is followed like any path they give; inside it, nothing is.
        self.directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        top = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, _DIR_MODE, dir_fd=top)
            fd = _open_no_link(name, _DIR, 0, top, self.directory)
            role = self._roles[name] = _Role(fd, self.directory / name)
        finally:
            os.close(top)
        return role

    def _seal(self, request: _Request) -> None:
        """Rename the role's pending files to the step's, write their heads; then, released, gzip each."""
        if request.trained is not None:
            self._write_filing(request)
        role = self._roles.get(request.role)
        if role is None:
            return
        files, role.files = role.files, []
        sealed: list[str] = []
        for file in files:
            _close(file)
            stem = f"step-{request.step:06d}-{file.file_id}"
            try:
                if not file.size:
                    os.unlink(file.name, dir_fd=role.dir_fd)
                    continue
                os.rename(file.name, stem + ".jsonl", src_dir_fd=role.dir_fd, dst_dir_fd=role.dir_fd)
                sealed.append(stem)
                if file.heads is not None:
                    _write_new(role.dir_fd, stem + ".heads", [b"".join(file.heads)])
            except OSError as error:
                self.write_errors += 1
                self._warn(f"seal {error.errno}", f"could not seal {file.name} as step {request.step}: {error}")
        _fsync(role.dir_fd)
        request.done.set()  # the log function goes on; the episodes are filed under the step
        for stem in sealed:
            try:
                with open(os.open(stem + ".jsonl", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=role.dir_fd), "rb", 0) as source:
                    _write_new(role.dir_fd, stem + ".jsonl.gz", _gzip(source.fileno()))
                _fsync(role.dir_fd)
                os.unlink(stem + ".jsonl", dir_fd=role.dir_fd)
            except OSError as error:
                self.write_errors += 1
                self._warn(f"gzip {error.errno}", f"{stem}.jsonl left uncompressed (readable as it is): {error}")

    def _write_filing(self, request: _Request) -> None:
        """``step-N-<file id>.filing``: a JSON line per episode trained, then per one dropped since (a new file)."""
        assert request.trained is not None
        self._files_made += 1
        name = f"step-{request.step:06d}-{self.writer_id}-{self._files_made}.filing"
        try:
            role = self._role(request.role)
            lines = [json.dumps({"episode_id": i, "trained": True}) + "\n" for i in request.trained]
            lines += [json.dumps({"episode_id": i, "trained": False, "reason": r}) + "\n" for i, r in role.not_trained]
            _write_new(role.dir_fd, name, ["".join(lines).encode()])
            role.not_trained.clear()
        except OSError as error:  # the episodes are unaffected; the dropped stay noted for the next filing
            self.write_errors += 1
            self._warn(f"filing {error.errno}", f"could not write {name}: {error}")

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:  # a rare race warns twice: harmless
            self._warned.add(key)
            logger.warning("episode store %s: %s [logged once]", self.directory, message)


def _open_no_link(name: str, flags: int, mode: int, dir_fd: int, shown: Path) -> int:
    """``os.open`` of ``name`` in ``dir_fd`` that refuses a symbolic link with a clear error."""
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as error:
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        if link:
            raise OSError(
                error.errno,
                f"{shown / name} is a symbolic link the store did not make, and the store writes "
                "through no link: remove it, or point NEMO_GYM_EPISODE_DIR at a real folder",
            ) from None
        raise


def _close(file: _File) -> None:
    if file.fd is not None:
        with contextlib.suppress(OSError):
            os.close(file.fd)
        file.fd = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _gzip(fd: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    """The file behind ``fd`` as one gzip stream, chunk by chunk."""
    compressor = zlib.compressobj(_COMPRESS_LEVEL, zlib.DEFLATED, 31)
    while block := os.read(fd, chunk):
        yield compressor.compress(block)
    yield compressor.flush()


def _write_new(dir_fd: int, name: str, chunks: Iterable[bytes]) -> None:
    """Write ``name`` as a new file: under a temporary name, fsynced, then renamed."""
    temporary = f".{name}.tmp-{secrets.token_hex(4)}"
    fd = os.open(temporary, _NEW_FILE, _FILE_MODE, dir_fd=dir_fd)
    try:
        with open(fd, "wb", 0):  # closes fd
            for chunk in chunks:
                _write_all(fd, chunk)
            os.fsync(fd)
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise


def _fsync(dir_fd: int) -> None:
    with contextlib.suppress(OSError):  # some file systems refuse fsync on a folder
        os.fsync(dir_fd)


class Stores:
    """This process's stores, one per folder, started on first use (``runtime.current().stores``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_folder: dict[str, EpisodeStore] = {}
        atexit.register(self.close)

    def get(self, directory: str) -> EpisodeStore:
        with self._lock:
            store = self._by_folder.get(directory)
            if store is None:
                store = self._by_folder[directory] = EpisodeStore(Path(directory))
            return store

    def seal_all(self, role: str, step: int, trained: list[str] | None = None) -> None:
        """Tie ``role``'s pending episodes to ``step`` in every store (with ``trained``: file them too)."""
        for store in self._all():
            store.seal(role, step, trained=trained)

    def not_trained_all(self, role: str, episode_ids: list[str], reason: str) -> None:
        """Note ``episode_ids`` as not trained for ``reason`` in every store (filed at the next seal)."""
        for store in self._all():
            store.not_trained(role, episode_ids, reason)

    def _all(self) -> list[EpisodeStore]:
        with self._lock:
            return list(self._by_folder.values())

    def close(self, timeout_s: float = 10.0) -> None:
        """Close every store (what is queued is written) and forget them."""
        with self._lock:
            stores = list(self._by_folder.values())
            self._by_folder.clear()
        for store in stores:
            store.close(timeout_s)


def session_id(base_url: str) -> str | None:
    """The Miles session id in ``base_url`` (``.../sessions/<id>``), if there is one."""
    _, sep, tail = base_url.rstrip("/").rpartition("/sessions/")
    return tail.split("/")[0] or None if sep else None


def entry_for(
    *, record: EpisodeRecord, reward: float, role: str, eval_set: str | None, session: str | None, repo: str | None
) -> dict[str, Any]:
    """The store's fields for one episode (the raw answer is added by the writer). Pure."""
    return {
        "episode_id": record.episode_id,
        "instance_id": record.instance_id,
        "repo": repo,
        "role": role,
        "eval_set": eval_set,
        "session_id": session,
        "finished_at": round(time.time(), 3),
        "reward": reward,
        "record": record,
    }
