"""The episode store: every episode the agent function ran, on disk, findable by step and role.

Layout of ``NEMO_GYM_EPISODE_DIR``::

    train/step-000005.jsonl.gz      episodes of rollout step 5 (one JSON object a line)
    eval/step-000010.jsonl.gz       episodes of the eval run at rollout step 10 (all sets)
    train/pending-<pid>.jsonl       episodes finished since the last step was logged

The agent function does not know the rollout step. An episode is appended to its role's
``pending`` file as it finishes (one ``write`` of one line); when Miles calls the step's
log function (which it gives ``rollout_id``), ``seal`` renames that file to the step's
name and then compresses it. A crash in between leaves the plain file, whose episodes
``miles-nemogym episodes`` still shows (step unknown while pending); a line cut by a
crash is the only loss, and readers skip it.

Compression waits for the step's end on purpose: measured with ``bench/agent_bench.py``,
compressing each 84 KB answer as it arrives doubled the client's CPU per episode and
halved its saturation throughput on 2 cores, while at the step's end the rollout process
is idle (the trainer is training) and the work is done once per step.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miles_nemogym.episode.record import EpisodeRecord

logger = logging.getLogger(__name__)

ROLES = ("train", "eval")
MAX_PENDING_BYTES = 256 * 1024 * 1024
"""Raw answers queued for the writer, at most (a burst of 1,000 real 84 KB answers is ~84 MB)."""
WRITE_BATCH = 256
"""Most queued episodes written by one ``write``."""
COMPRESS_LEVEL = 1
"""zlib level 1: ~5x smaller on trajectories at a fraction of level 6's CPU."""


def step_file(directory: Path, role: str, step: int) -> Path:
    """The step's compressed file (its plain ``.jsonl`` exists while it is compressed)."""
    return directory / role / f"step-{step:06d}.jsonl.gz"


def pending_file(directory: Path, role: str) -> Path:
    return directory / role / f"pending-{os.getpid()}.jsonl"


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


def compress_into(source: Path, target: Path, chunk: int = 1 << 20) -> None:
    """Append ``source`` to ``target`` as one gzip member (concatenated members are one
    valid gzip file, so a step logged twice keeps both batches)."""
    compressor = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 31)
    with source.open("rb") as src, target.open("ab") as dst:
        while block := src.read(chunk):
            dst.write(compressor.compress(block))
        dst.write(compressor.flush())
        dst.flush()
        os.fsync(dst.fileno())


@dataclass
class _Entry:
    role: str
    entry: dict[str, Any]
    answer: bytes | None
    answer_is_json: bool
    scrub: Callable[[bytes], bytes] | None = None


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

    def add(
        self,
        role: str,
        entry: dict[str, Any],
        answer: bytes | None,
        answer_is_json: bool,
        scrub: Callable[[bytes], bytes] | None = None,
    ) -> None:
        """Queue one finished episode; never blocks, never raises. ``scrub`` removes the
        policy API key from the raw answer, on the writer thread (~0.2 ms per 84 KB)."""
        size = len(answer) if answer else 0
        with self._lock:
            if size and self._pending_bytes + size > MAX_PENDING_BYTES:
                self.answers_dropped += 1
                entry = {**entry, "answer_dropped": "the store's writer was behind; raw answer not kept"}
                answer, size = None, 0
            self._pending_bytes += size
        self._queue.put(_Entry(role, entry, answer, answer_is_json, scrub))

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
            batch = [self._queue.get()]
            # Take what else is queued: one write per role and batch, fewer GIL hand-offs.
            while len(batch) < WRITE_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            entries: list[_Entry] = []
            for item in batch:
                if isinstance(item, _Entry):
                    entries.append(item)
                    continue
                self._guarded(self._write, entries)  # what came before a seal is filed first
                entries = []
                if item is None:
                    return
                self._guarded(self._seal, item)
                item.done.set()
            self._guarded(self._write, entries)

    def _guarded(self, action: Any, argument: Any) -> None:
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
                data = b"".join(
                    encode_line(i.entry, i.scrub(i.answer) if i.scrub and i.answer else i.answer, i.answer_is_json)
                    for i in mine
                )
                path = pending_file(self.directory, role)
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
                self.lines_written += len(mine)
            except (OSError, ValueError) as error:
                self.write_errors += len(mine)
                self._warn(
                    type(error).__name__ + str(getattr(error, "errno", "")),
                    f"episode store: {len(mine)} episode(s) not saved in {self.directory} ({error}); "
                    "training goes on, the samples are unaffected",
                )

    def _seal(self, item: _Seal) -> None:
        """File the role's pending episodes under the step, then compress them. The caller
        (the log function) waits only for the rename."""
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
        "record": record.model_dump(mode="json"),
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
