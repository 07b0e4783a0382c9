"""The episode store: every episode the agent function runs, on disk by role and step.

The agent runs against a real loopback ``/run`` server (``tests/support/fault_server.py``) with
the wheel's real results; the log functions tie pending episodes to their step.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym import agent, metrics
from miles_nemogym.episode import send
from miles_nemogym.episode.record import eval_overrides
from miles_nemogym.store import writer as episode_store
from miles_nemogym.store.browser import load
from tests.support.fault_server import FaultServer

SESSION = "http://127.0.0.1:39999/sessions/s-7"
KEY = "sk-secret-episode-store-key"


@pytest.fixture
def store_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "episodes"
    monkeypatch.setenv("NEMO_GYM_EPISODE_DIR", str(folder))
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", KEY)
    monkeypatch.delenv("MILES_ROUTER_EXTERNAL_HOST", raising=False)
    return folder


@pytest.fixture
async def fault_gym(sympy_result: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FaultServer]:
    """A ``/run`` server answering the real sympy result (a test may set its ``mode``); NEMO_GYM_URL names it."""
    srv = await FaultServer(result=sympy_result).start()
    monkeypatch.setenv("NEMO_GYM_URL", srv.url)
    yield srv
    await srv.stop()


async def _run(metadata: dict[str, Any], session: str = SESSION) -> dict[str, Any]:
    return await agent.run(base_url=session, prompt="x", request_kwargs={"temperature": 1.0}, metadata=metadata)


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.gz"))


def _all_bytes(folder: Path) -> bytes:
    out = b""
    for path in folder.rglob("*.gz"):
        with gzip.open(path) as handle:
            out += handle.read()
    return out


def _make_file(path: Path) -> Path:
    path.write_text("a file, not a folder")
    return path


def _full_disk_folder(folder: Path) -> Path:
    """A store folder whose pending train file is /dev/full (every write: ENOSPC)."""
    (folder / "train").mkdir(parents=True)
    os.symlink("/dev/full", folder / "train" / f"pending-{os.getpid()}.jsonl")
    return folder


def _flush(folder: Path) -> None:
    episode_store.get_store(str(folder)).flush()


async def test_train_and_eval_episodes_are_filed_by_role_and_step(
    fault_gym: FaultServer,
    store_dir: Path,
    sympy_row: dict[str, Any],
    sympy_result: dict[str, Any],
) -> None:
    train = [await _run(sympy_row, f"http://127.0.0.1:1/sessions/t{i}") for i in range(2)]
    metrics.log_rollout(3, None, [])
    evals = [
        await _run({**sympy_row, **eval_overrides("verified")}, f"http://127.0.0.1:1/sessions/e{i}") for i in range(2)
    ]
    metrics.log_eval(3, None, {"verified": {"samples": [], "rewards": []}})

    _flush(store_dir)  # the log functions wait for the rename; compression follows
    assert _files(store_dir) == [
        "eval/step-000003.jsonl.gz",
        "train/step-000003.jsonl.gz",
    ]
    # The role marks are ours: they never reach the Gym server.
    assert all("nemogym_role" not in body and "nemogym_eval_set" not in body for body in fault_gym.bodies)
    store = load(store_dir)
    by_role = {role: [e for e in store.episodes if e.role == role] for role in ("train", "eval")}
    assert [e.entry["session_id"] for e in by_role["train"]] == ["t0", "t1"]
    assert [e.entry["session_id"] for e in by_role["eval"]] == ["e0", "e1"]
    assert [e.entry["eval_set"] for e in by_role["eval"]] == ["verified", "verified"]
    assert {e.step for e in store.episodes} == {3}
    # Two samples of one instance are two episodes, kept apart.
    assert sorted(e.episode_id for e in by_role["train"]) == sorted(r["nemogym"]["episode_id"] for r in train)
    assert sorted(e.episode_id for e in by_role["eval"]) == sorted(r["nemogym"]["episode_id"] for r in evals)
    first = by_role["train"][0].entry
    assert first["instance_id"] == sympy_row["instance_id"] and first["repo"] == sympy_row["repo"]
    assert first["record"]["status"] == "ok"
    # The /run answer as received: the server's whole result, trajectory included.
    assert first["answer"]["response"]["output"] == sympy_result["response"]["output"]
    assert first["answer"]["metadata"]["model_patch"] == sympy_result["metadata"]["model_patch"]
    assert KEY.encode() not in _all_bytes(store_dir)


async def test_failed_episode_is_saved_with_what_came_back(
    fault_gym: FaultServer,
    store_dir: Path,
    sympy_row: dict[str, Any],
) -> None:
    fault_gym.mode = "500"
    out = await _run(sympy_row)
    _flush(store_dir)
    (episode,) = load(store_dir).episodes
    assert episode.step is None  # not yet tied to a step: still findable
    assert episode.kind == out["nemogym"]["failure_kind"] == "agent_run_error"
    assert episode.entry["record"]["http_status"] == 500
    assert isinstance(episode.entry["answer"], dict) and set(episode.entry["answer"]) == {"text"}


async def test_an_answer_echoing_the_api_key_is_stored_without_it(
    fault_gym: FaultServer,
    store_dir: Path,
    sympy_row: dict[str, Any],
    sympy_result: dict[str, Any],
) -> None:
    fault_gym.mode = "echo_key_error"
    await _run(sympy_row)
    _flush(store_dir)
    (episode,) = load(store_dir).episodes
    assert episode.entry["answer"]["metadata"]["error"] == "auth failed for ***"
    assert episode.entry["answer"]["response"]["output"] == sympy_result["response"]["output"]
    assert KEY.encode() not in _all_bytes(store_dir)


async def test_unreachable_server_episode_is_saved_without_an_answer(
    store_dir: Path, sympy_row: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("NEMO_GYM_OUTAGE_TIMEOUT", "0.5")
    try:
        await _run(sympy_row)
    finally:
        await send.close_client()
    _flush(store_dir)
    (episode,) = load(store_dir).episodes
    assert episode.kind == "transport_unreachable" and episode.entry["answer"] is None


@pytest.mark.parametrize(
    ("broken", "logged"),
    [
        # A regular file where the folder should be: every mkdir fails (as on a read-only mount).
        ("not_a_folder", "not saved"),
        # /dev/full answers every write with ENOSPC: the store's folder is a file there.
        ("full_disk", "No space left on device"),
    ],
)
async def test_a_store_that_cannot_write_is_a_warning_not_a_failed_sample(
    fault_gym: FaultServer,
    tmp_path: Path,
    sympy_row: dict[str, Any],
    sympy_result: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    broken: str,
    logged: str,
) -> None:
    folder = _make_file(tmp_path / "not-a-folder") if broken == "not_a_folder" else _full_disk_folder(tmp_path / "full")
    monkeypatch.setenv("NEMO_GYM_EPISODE_DIR", str(folder))
    monkeypatch.delenv("NEMO_GYM_POLICY_API_KEY", raising=False)
    out = await _run(sympy_row)
    store = episode_store.get_store(str(folder))
    store.flush()
    assert out["nemogym"]["status"] == "ok" and out["reward"] == sympy_result["reward"]
    assert (store.write_errors, store.lines_written) == (1, 0)
    assert logged in caplog.text


def test_a_line_cut_by_a_crash_loses_only_that_line(tmp_path: Path) -> None:
    path = tmp_path / "train" / f"pending-{os.getpid()}.jsonl"
    path.parent.mkdir()
    lines = [episode_store.encode_line({"episode_id": str(i)}, None, False) for i in range(3)]
    path.write_bytes(lines[0] + lines[1] + lines[2][: len(lines[2]) // 2])
    store = load(tmp_path)
    assert [(e.episode_id, e.step) for e in store.episodes] == [("0", None), ("1", None)]
    assert store.cut_files == [str(path)]


def test_a_crash_while_compressing_a_step_loses_nothing(tmp_path: Path) -> None:
    # The step's plain file was renamed, its compressed copy half written: read the plain one.
    folder = tmp_path / "train"
    folder.mkdir()
    lines = [episode_store.encode_line({"episode_id": str(i)}, None, False) for i in range(3)]
    (folder / "step-000002.jsonl").write_bytes(b"".join(lines))
    episode_store.compress_into(folder / "step-000002.jsonl", folder / "step-000002.jsonl.gz")
    gz = (folder / "step-000002.jsonl.gz").read_bytes()
    (folder / "step-000002.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    assert [(e.episode_id, e.step) for e in load(tmp_path).episodes] == [("0", 2), ("1", 2), ("2", 2)]


def test_backlog_past_the_bound_keeps_the_record_without_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(episode_store, "MAX_PENDING_BYTES", 10)
    store = episode_store.EpisodeStore(tmp_path)
    store.add("train", {"episode_id": "big"}, b'{"reward": 1.0, "pad": "' + b"x" * 100 + b'"}', True)
    store.close()
    (episode,) = load(tmp_path).episodes
    assert episode.entry["answer"] is None and "answer_dropped" in episode.entry
    assert store.answers_dropped == 1


def test_a_step_logged_twice_keeps_both_batches(tmp_path: Path) -> None:
    store = episode_store.EpisodeStore(tmp_path)
    store.add("eval", {"episode_id": "a"}, None, False)
    store.seal("eval", 5)
    store.add("eval", {"episode_id": "b"}, None, False)
    store.seal("eval", 5)
    store.close()
    assert [e.episode_id for e in load(tmp_path).episodes] == ["a", "b"]
    with gzip.open(tmp_path / "eval" / "step-000005.jsonl.gz") as handle:
        assert json.loads(handle.readline())["answer"] is None


def test_session_id_is_the_miles_session() -> None:
    assert episode_store.session_id("http://10.0.0.1:3000/sessions/abc-1") == "abc-1"
    assert episode_store.session_id("http://10.0.0.1:3000/") is None


_KILLED_WRITER = """
import json, os, signal, sys, time
from pathlib import Path
from miles_nemogym.store.writer import EpisodeStore, FLUSH_INTERVAL_S
store = EpisodeStore(Path(sys.argv[1]))
for i in range(40):
    store.add("train", {"episode_id": f"e{i}"}, json.dumps({"reward": 1.0, "pad": "x" * 84000}).encode(), True)
time.sleep(FLUSH_INTERVAL_S + 1.0)
os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no flush: a crashed rollout process
"""


def test_episodes_older_than_the_flush_interval_survive_a_killed_process(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], timeout=60, check=False)
    assert done.returncode == -9
    store = load(tmp_path)
    assert [e.episode_id for e in store.episodes] == [f"e{i}" for i in range(40)]
    assert store.episodes[0].step is None and store.episodes[39].entry["answer"]["pad"] == "x" * 84000
    assert store.cut_files == []
