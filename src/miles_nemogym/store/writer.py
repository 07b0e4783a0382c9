"""The episode store: every episode the agent function ran, on disk, findable by step and role.

Episodes are appended, as they finish, to ``<role>/pending-<pid>.jsonl`` by one writer
thread; the step's log function (``seal``) renames that file to ``<role>/step-N.jsonl``
and compresses it to ``step-N.jsonl.gz``. Layout, crash behaviour and why it is written
this way: docs/episode-store.md.
"""

from __future__ import annotations

import atexit
import gzip
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pydantic_core

from miles_nemogym.episode.record import EpisodeRecord
from miles_nemogym.store.append import Appender

logger = logging.getLogger(__name__)

ROLES = ("train", "eval")
MAX_PENDING_BYTES = 256 * 1024 * 1024
"""Raw answers held for the writer, at most; past it an episode is kept without its answer."""
FLUSH_INTERVAL_S = 0.25
"""The writer wakes at most this long after an episode is queued (one write per wake)."""
FLUSH_BYTES = 16 * 1024 * 1024
"""Queued answers that wake the writer before the interval ends."""
COMPRESS_LEVEL = 1
"""zlib level 1: ~4x smaller on trajectories at a fraction of level 6's CPU."""


def step_file(directory: Path, role: str, step: int) -> Path:
    """The step's compressed file (its plain ``.jsonl`` exists while it is compressed)."""
    return directory / role / f"step-{step:06d}.jsonl.gz"


def pending_file(directory: Path, role: str) -> Path:
    """Where this process appends ``role``'s episodes not yet tied to a step."""
    return directory / role / f"pending-{os.getpid()}.jsonl"


def entry_head(entry: dict[str, Any]) -> bytes:
    """The start of ``entry``'s store line, up to where the raw answer goes."""
    # pydantic-core's encoder: several times faster than json's, and it takes the record
    # model as it is; non-finite numbers become null, so the line stays strict JSON.
    return pydantic_core.to_json(entry, inf_nan_mode="null")[:-1] + b',"answer":'


def line_parts(head: bytes, answer: bytes | None, answer_is_json: bool) -> list[bytes]:
    """One store line as buffers: the answer inlined after ``head``, not copied."""
    if answer is None:
        return [head, b"null}\n"]
    if answer_is_json:
        return [head, answer, b"}\n"]
    return [head, json.dumps({"text": answer.decode("utf-8", "replace")}).encode(), b"}\n"]


def encode_line(entry: dict[str, Any], answer: bytes | None, answer_is_json: bool) -> bytes:
    """One store line (``line_parts`` joined)."""
    return b"".join(line_parts(entry_head(entry), answer, answer_is_json))


def compress_into(source: Path, target: Path, chunk: int = 1 << 20) -> None:
    """Append ``source`` to ``target`` as one gzip member and fsync it (concatenated
    members are one valid gzip file, so a step logged twice keeps both batches)."""
    compressor = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 31)
    with source.open("rb") as src, target.open("ab") as dst:
        while block := src.read(chunk):
            dst.write(compressor.compress(block))
        dst.write(compressor.flush())
        dst.flush()
        os.fsync(dst.fileno())


class _Entry(NamedTuple):
    """One queued episode: bytes, flags and the scrubber, no containers for the collector to walk."""

    role: str
    head: bytes
    answer: bytes | None
    answer_is_json: bool
    scrub: Callable[[bytes], bytes] | None


@dataclass
class _Seal:
    """Tie ``role``'s pending episodes to ``step``; an empty role only marks a flush."""

    role: str
    step: int
    done: threading.Event = field(default_factory=threading.Event)


_STOP = object()


class EpisodeStore:
    """One folder's store and its writer thread: ``add`` queues, the thread writes in batches."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._items: list[_Entry | _Seal | object] = []
        self._pending_bytes = 0
        self._has_items = threading.Event()  # something is queued
        self._urgent = threading.Event()  # write now: a seal, a flush, or FLUSH_BYTES queued
        self.answers_dropped = 0
        self.lines_written = 0
        self.write_errors = 0
        self._warned: set[str] = set()
        self._appenders: dict[str, Appender] = {}  # used by the writer thread only
        self._thread = threading.Thread(target=self._work, name="nemogym-episode-store", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ any thread

    def add(
        self,
        role: str,
        entry: dict[str, Any],
        answer: bytes | None,
        answer_is_json: bool,
        scrub: Callable[[bytes], bytes] | None = None,
    ) -> None:
        """Queue one finished episode; never blocks, never raises. ``scrub`` (removing the
        policy API key from the raw answer) runs on the writer thread."""
        try:
            # Encoded here, not by the writer: a queue of bytes holds nothing the garbage
            # collector has to walk, and the record may change once this returns.
            head = entry_head(entry)
            if not self._queue(_Entry(role, head, answer, answer_is_json, scrub)):
                dropped = {**entry, "answer_dropped": "the store's writer was behind; raw answer not kept"}
                self._queue(_Entry(role, entry_head(dropped), None, False, None))
        except Exception as error:  # an entry that cannot be encoded: the sample is unaffected
            self.write_errors += 1
            self._warn(type(error).__name__, f"episode store: an episode could not be encoded ({error})")

    def _queue(self, item: _Entry) -> bool:
        """Queue ``item``; False (nothing queued) if its answer would pass the backlog bound."""
        size = len(item.answer) if item.answer else 0
        with self._lock:
            if size and self._pending_bytes + size > MAX_PENDING_BYTES:
                self.answers_dropped += 1
                return False
            self._pending_bytes += size
            self._items.append(item)
            # Checked under the lock the writer clears them under: Event.set costs a
            # Condition round trip, and this runs on the event loop for every episode.
            if not self._has_items.is_set():
                self._has_items.set()
            if self._pending_bytes >= FLUSH_BYTES and not self._urgent.is_set():
                self._urgent.set()
        return True

    def seal(self, role: str, step: int, timeout_s: float = 30.0) -> None:
        """Tie every episode of ``role`` queued so far to rollout ``step`` (waits for the rename)."""
        if not self._request(_Seal(role, step), timeout_s):
            logger.warning("episode store: sealing %s step %d is still running after %.0fs", role, step, timeout_s)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until everything queued so far is on disk (tests; shutdown)."""
        self._request(_Seal("", -1), timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued and stop the writer thread."""
        self.flush(timeout_s)
        self._put_urgent(_STOP)
        self._thread.join(timeout_s)

    def _request(self, request: _Seal, timeout_s: float) -> bool:
        if not self._thread.is_alive():
            return True
        self._put_urgent(request)
        return request.done.wait(timeout_s)

    def _put_urgent(self, item: object) -> None:
        with self._lock:
            self._items.append(item)
            self._has_items.set()
            self._urgent.set()

    # ------------------------------------------------------------------ writer thread

    def _work(self) -> None:
        while True:
            self._has_items.wait()
            # Let a batch gather: one writev per role per wake instead of one per episode,
            # and the event loop's thread is not interrupted for each answer.
            self._urgent.wait(FLUSH_INTERVAL_S)
            with self._lock:
                items, self._items = self._items, []
                self._has_items.clear()
                self._urgent.clear()
            entries: list[_Entry] = []
            for item in items:
                if isinstance(item, _Entry):
                    entries.append(item)
                    continue
                self._guarded(self._write, entries)  # what came before a seal is filed first
                entries = []
                if item is _STOP:
                    for role in list(self._appenders):
                        self._close_appender(role)
                    return
                if isinstance(item, _Seal):
                    if item.role:
                        self._guarded(self._seal, item)
                    item.done.set()
            self._guarded(self._write, entries)

    def _guarded(self, action: Callable[[Any], None], argument: Any) -> None:
        try:
            action(argument)
        except Exception as error:  # the store must never take the rollout down
            self._warn(type(error).__name__, f"episode store: {type(error).__name__}: {error}")
            if isinstance(argument, _Seal):
                argument.done.set()

    def _write(self, items: list[_Entry]) -> None:
        if not items:
            return
        with self._lock:
            self._pending_bytes -= sum(len(item.answer) for item in items if item.answer)
        for role in {item.role for item in items}:
            mine = [item for item in items if item.role == role]
            try:
                parts: list[bytes] = []
                for i in mine:
                    answer = i.scrub(i.answer) if i.scrub and i.answer else i.answer
                    parts += line_parts(i.head, answer, i.answer_is_json)
                self._appender(role).write(parts)
                self.lines_written += len(mine)
            except (OSError, ValueError) as error:
                self._close_appender(role)  # reopened (and its file re-read) on the next batch
                self.write_errors += len(mine)
                self._warn(
                    type(error).__name__ + str(getattr(error, "errno", "")),
                    f"episode store: {len(mine)} episode(s) not saved in {self.directory} ({error}); "
                    "training goes on, the samples are unaffected",
                )

    def _seal(self, item: _Seal) -> None:
        """File the role's pending episodes under the step, then compress them; the caller
        (the log function) waits only for the rename."""
        self._close_appender(item.role)  # the pending file is renamed; the next batch opens a new one
        source = pending_file(self.directory, item.role)
        target = step_file(self.directory, item.role, item.step)
        plain = target.with_suffix("")  # step-N.jsonl
        try:
            if not source.exists():
                return
            if plain.exists():  # a batch of this step not yet compressed (a crash, a re-log)
                compress_into(plain, target)
                plain.unlink()
            source.rename(plain)
        except OSError as error:
            self.write_errors += 1
            self._warn("seal" + str(error.errno), f"episode store: could not file {source} as {plain.name}: {error}")
            return
        finally:
            item.done.set()
        try:
            compress_into(plain, target)
            plain.unlink()
        except OSError as error:
            self.write_errors += 1
            self._warn("gzip" + str(error.errno), f"episode store: {plain} left uncompressed: {error}")

    def _appender(self, role: str) -> Appender:
        appender = self._appenders.get(role)
        if appender is None:
            path = pending_file(self.directory, role)
            path.parent.mkdir(parents=True, exist_ok=True)
            appender = self._appenders[role] = Appender(path)
        return appender

    def _close_appender(self, role: str) -> None:
        appender = self._appenders.pop(role, None)
        if appender is not None:
            appender.close()

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("%s [logged once]", message)


_stores: dict[str, EpisodeStore] = {}
_stores_lock = threading.Lock()


def get_store(directory: str) -> EpisodeStore:
    """The process's store for ``directory``, started on first use."""
    with _stores_lock:
        store = _stores.get(directory)
        if store is None:
            store = _stores[directory] = EpisodeStore(Path(directory))
        return store


def seal_all(role: str, step: int) -> None:
    """Tie ``role``'s pending episodes to ``step`` in every store of this process."""
    with _stores_lock:
        stores = list(_stores.values())
    for store in stores:
        store.seal(role, step)


@atexit.register
def _close_all() -> None:
    with _stores_lock:
        stores = list(_stores.values())
    for store in stores:
        store.close(timeout_s=10.0)


def session_id(base_url: str) -> str | None:
    """The Miles session id in ``base_url`` (``.../sessions/<id>``), if there is one."""
    _, sep, tail = base_url.rstrip("/").rpartition("/sessions/")
    return tail.split("/")[0] or None if sep else None


def entry_for(
    *,
    record: EpisodeRecord,
    reward: float,
    role: str,
    eval_set: str | None,
    session: str | None,
    repo: str | None,
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


def read_lines(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """(the entries of one store file, plain or gzip, whether its tail was cut by a crash)."""
    entries: list[dict[str, Any]] = []
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            for line in handle:
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    return entries, True
    except (EOFError, gzip.BadGzipFile, zlib.error):
        return entries, True
    return entries, False
