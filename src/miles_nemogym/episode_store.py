"""The episode store: every episode the agent function ran, on disk, findable by step and role.

Layout of ``NEMO_GYM_EPISODE_DIR``::

    train/step-000005.jsonl.gz      episodes of rollout step 5 (one JSON object a line)
    eval/step-000010.jsonl.gz       episodes of the eval run at rollout step 10 (all sets)
    train/pending-<pid>.jsonl.gz    episodes finished since the last step was logged

The agent function does not know the rollout step. An episode is appended to its role's
``pending`` file as it finishes; when Miles calls the step's log function (which it gives
``rollout_id``), ``seal`` renames that file to the step's name. A crash in between leaves
the pending file, whose episodes ``miles-nemogym episodes`` still shows (step unknown).
Each line is its own gzip member, flushed as written, so a crash mid-write loses at most
that line, and a reader stops cleanly at a cut tail.

A line holds the ``/run`` answer as received (API key already scrubbed by the client),
our episode record, the instance id, the session id, the role and eval set, and the time.

All disk work runs on one writer thread; the event loop only puts entries on a queue.
The queue is bounded in bytes: past ``MAX_PENDING_BYTES`` an entry is kept without its
raw answer (and counted) rather than holding memory or blocking the loop. Disk errors
(full, read-only) are logged as warnings, never raised into a sample.
"""

from __future__ import annotations

import atexit
import gzip
import json
import logging
import os
import queue
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ROLES = ("train", "eval")
MAX_PENDING_BYTES = 256 * 1024 * 1024
"""Raw answers queued for the writer, at most (a burst of 1,000 real 84 KB answers is ~84 MB)."""
COMPRESS_LEVEL = 1
"""zlib level 1: ~5x smaller on trajectories at a fraction of level 6's CPU."""


def step_file(directory: Path, role: str, step: int) -> Path:
    return directory / role / f"step-{step:06d}.jsonl.gz"


def pending_file(directory: Path, role: str) -> Path:
    return directory / role / f"pending-{os.getpid()}.jsonl.gz"


def encode_line(entry: dict[str, Any], answer: bytes | None, answer_is_json: bool) -> bytes:
    """One store line: ``entry`` with ``answer`` inlined (as JSON when it is a JSON result)."""
    head = json.dumps(entry, separators=(",", ":"), allow_nan=False)
    if answer is None:
        tail = b"null"
    elif answer_is_json:
        tail = answer
    else:
        tail = json.dumps({"text": answer.decode("utf-8", "replace")}).encode()
    return head[:-1].encode() + b',"answer":' + tail + b"}\n"


def gzip_member(line: bytes) -> bytes:
    """``line`` as one complete gzip member (concatenated members are one valid gzip file)."""
    compressor = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 31)
    return compressor.compress(line) + compressor.flush()


@dataclass
class _Entry:
    role: str
    entry: dict[str, Any]
    answer: bytes | None
    answer_is_json: bool


@dataclass
class _Seal:
    role: str
    step: int
    done: threading.Event = field(default_factory=threading.Event)


class EpisodeStore:
    """One folder's store with its writer thread; see the module docstring."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._queue: queue.SimpleQueue[_Entry | _Seal | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending_bytes = 0
        self.answers_dropped = 0
        self.lines_written = 0
        self.write_errors = 0
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._work, name="nemogym-episode-store", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ any thread

    def add(self, role: str, entry: dict[str, Any], answer: bytes | None, answer_is_json: bool) -> None:
        """Queue one finished episode; never blocks, never raises."""
        size = len(answer) if answer else 0
        with self._lock:
            if size and self._pending_bytes + size > MAX_PENDING_BYTES:
                self.answers_dropped += 1
                entry = {**entry, "answer_dropped": "the store's writer was behind; raw answer not kept"}
                answer, size = None, 0
            self._pending_bytes += size
        self._queue.put(_Entry(role, entry, answer, answer_is_json))

    def seal(self, role: str, step: int, timeout_s: float = 30.0) -> None:
        """Tie every episode of ``role`` queued so far to rollout ``step`` (waits for the writer)."""
        request = _Seal(role, step)
        self._queue.put(request)
        if not request.done.wait(timeout_s):
            logger.warning("episode store: sealing %s step %d is still running after %.0fs", role, step, timeout_s)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until everything queued so far is on disk (tests; shutdown)."""
        request = _Seal("", -1)
        self._queue.put(request)
        request.done.wait(timeout_s)

    # ------------------------------------------------------------------ writer thread

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if isinstance(item, _Seal):
                    if item.step >= 0:
                        self._seal(item.role, item.step)
                    item.done.set()
                else:
                    self._write(item)
            except Exception as error:  # the store must never take the rollout down
                self._warn(f"{type(error).__name__}", f"episode store: {type(error).__name__}: {error}")
                if isinstance(item, _Seal):
                    item.done.set()

    def _write(self, item: _Entry) -> None:
        with self._lock:
            self._pending_bytes -= len(item.answer) if item.answer else 0
        try:
            member = gzip_member(encode_line(item.entry, item.answer, item.answer_is_json))
            path = pending_file(self.directory, item.role)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, member)
            finally:
                os.close(fd)
            self.lines_written += 1
        except (OSError, ValueError) as error:
            self.write_errors += 1
            self._warn(
                type(error).__name__ + str(getattr(error, "errno", "")),
                f"episode store: episode {item.entry.get('episode_id')} not saved in {self.directory} ({error}); "
                "training goes on, the sample is unaffected",
            )

    def _seal(self, role: str, step: int) -> None:
        source = pending_file(self.directory, role)
        if not source.exists():
            return
        target = step_file(self.directory, role, step)
        try:
            if target.exists():
                # A step logged twice (an eval re-run, a resumed run): keep both, in order.
                with source.open("rb") as src, target.open("ab") as dst:
                    dst.write(src.read())
                source.unlink()
            else:
                source.rename(target)
        except OSError as error:
            self.write_errors += 1
            self._warn("seal" + str(error.errno), f"episode store: could not file {source} as {target.name}: {error}")

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("%s [logged once]", message)

    def close(self, timeout_s: float = 30.0) -> None:
        self.flush(timeout_s)
        self._queue.put(None)
        self._thread.join(timeout_s)


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
    record: dict[str, Any],
    reward: float,
    role: str,
    eval_set: str | None,
    session: str | None,
    repo: str | None,
) -> dict[str, Any]:
    """The store's fields for one episode (the raw answer is added by the writer). Pure."""
    return {
        "episode_id": record.get("episode_id"),
        "instance_id": record.get("instance_id"),
        "repo": repo,
        "role": role,
        "eval_set": eval_set,
        "session_id": session,
        "finished_at": round(time.time(), 3),
        "reward": reward,
        "record": record,
    }


def read_lines(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """(the entries of one store file, whether its tail was cut by a crash)."""
    entries: list[dict[str, Any]] = []
    try:
        with gzip.open(path, "rb") as handle:
            for line in handle:
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    return entries, True
    except (EOFError, gzip.BadGzipFile, zlib.error):
        return entries, True
    return entries, False
