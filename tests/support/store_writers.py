"""Rollout processes writing an episode store, for tests about processes: killed, restarted with
the same pid, out of disk space, or sealing a step at the same time as another process.

Run as ``python -m tests.support.store_writers SCENARIO DIR NAME [ARGS]``; prints the store's
counters as JSON when it ends normally. ``run`` starts one and waits for it.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from miles_nemogym.store import EpisodeStore


def answer(episode_id: str, size: int) -> bytes:
    """A JSON ``/run``-like answer of about ``size`` bytes (random: it compresses as little as a
    trajectory's patches do, so a compressed step's file grows as it is written)."""
    return json.dumps({"reward": 1.0, "episode": episode_id, "pad": secrets.token_hex(size // 2)}).encode()


def add(store: EpisodeStore, ids: list[str], size: int = 10_000) -> None:
    for episode_id in ids:
        store.add("train", {"episode_id": episode_id, "finished_at": time.time()}, answer(episode_id, size), True)


def _counters(store: EpisodeStore) -> None:
    print(json.dumps({"lines_written": store.lines_written, "write_errors": store.write_errors}))


def _dying_compressor(after_chunks: int) -> None:
    """Every gzip compressor this process makes kills it (SIGKILL) after ``after_chunks`` chunks."""
    real = zlib.compressobj

    class Dying:
        def __init__(self, *args: Any) -> None:
            self._inner, self._chunks = real(*args), 0

        def compress(self, data: bytes) -> bytes:
            self._chunks += 1
            if self._chunks > after_chunks:
                os.kill(os.getpid(), signal.SIGKILL)
            return self._inner.compress(data)

        def flush(self, *args: Any) -> bytes:
            return self._inner.flush(*args)

    zlib.compressobj = Dying  # type: ignore[assignment,misc]


def main(scenario: str, folder: Path, name: str, *args: str) -> None:
    real_pid = os.getpid()
    if scenario.startswith("pid-1"):  # pid 1 in a container, before and after a restart
        os.getpid = lambda: 1
    store = EpisodeStore(folder)
    if scenario.startswith("pid-1"):
        add(store, [f"{name}-{i}" for i in range(int(args[0]))])
        if scenario == "pid-1-killed":
            store.flush()
            os.kill(real_pid, signal.SIGKILL)
    elif scenario == "disk-full-then-space":
        # The file size limit stands in for a full disk: writes past it fail (EFBIG), a write
        # across it is cut short; then the limit is lifted, as when space was freed.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (25_000, hard))
        add(store, [f"{name}-full-{i}" for i in range(5)])
        store.flush()
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        add(store, [f"{name}-later-{i}" for i in range(5)])
    elif scenario == "killed-compressing":  # SIGKILL while the step's file is compressed
        add(store, [f"{name}-{i}" for i in range(int(args[0]))])
        _dying_compressor(after_chunks=1)
        store.seal("train", int(args[1]))
        store.flush()
        time.sleep(60)  # not reached: killed while compressing
    elif scenario == "seal-race":  # steps 1..N, each sealed when the test says go
        for step in range(1, int(args[0]) + 1):
            add(store, [f"{name}-s{step}-{i}" for i in range(40)])
            store.flush()
            (folder / f"ready-{name}-{step}").touch()
            while not (folder / f"go-{step}").exists():
                time.sleep(0.001)
            store.seal("train", step)
    elif scenario == "seal":
        add(store, [f"{name}-{i}" for i in range(int(args[0]))])
        store.seal("train", int(args[1]))
    store.close()
    _counters(store)


def start(scenario: str, folder: Path, name: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.store_writers", scenario, str(folder), name, *map(str, args)],
        stdout=subprocess.PIPE,
        text=True,
    )


def run(scenario: str, folder: Path, name: str, *args: object) -> tuple[int, dict[str, Any]]:
    """(the process's return code, its counters if it ended normally)."""
    process = start(scenario, folder, name, *args)
    out, _ = process.communicate(timeout=120)
    return process.returncode, json.loads(out) if process.returncode == 0 else {}


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], *sys.argv[4:])
