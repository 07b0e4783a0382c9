"""The episode store: every episode the agent function runs, on disk by role and step, and
read back whatever else is on disk.

The agent runs against a real loopback ``/run`` server (``tests/support/fault_server.py``) with
the wheel's real results; the log functions tie pending episodes to their step. Cases about
processes (killed, restarted with the same pid, a full disk, two sealing at once) run real
ones (``tests/support/store_writers.py``).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym import agent, metrics, transport
from miles_nemogym import store as episode_store
from miles_nemogym.episode.record import eval_overrides
from miles_nemogym.runtime import current
from miles_nemogym.store._reader import UNFILED, load
from tests.support import store_writers
from tests.support.fault_server import FaultServer
from tests.support.runtime_settings import UseSettings

SESSION = "http://127.0.0.1:39999/sessions/s-7"
KEY = "sk-secret-episode-store-key"

# The hooks run on the settings given here (defaults unless a test gives one), never the shell's.
pytestmark = pytest.mark.usefixtures("use_settings")


@pytest.fixture
def store_dir(tmp_path: Path, use_settings: UseSettings) -> Path:
    folder = tmp_path / "episodes"
    use_settings(NEMO_GYM_EPISODE_DIR=str(folder), NEMO_GYM_POLICY_API_KEY=KEY)
    return folder


@pytest.fixture
async def fault_gym(sympy_result: dict[str, Any], use_settings: UseSettings) -> AsyncIterator[FaultServer]:
    """A ``/run`` server answering the real sympy result (a test may set its ``mode``); NEMO_GYM_URL names it."""
    srv = await FaultServer(result=sympy_result).start()
    use_settings(NEMO_GYM_URL=srv.url)
    yield srv
    await srv.stop()


async def _run(metadata: dict[str, Any], session: str = SESSION) -> dict[str, Any]:
    return await agent.run(base_url=session, prompt="x", request_kwargs={"temperature": 1.0}, metadata=metadata)


def _files(folder: Path) -> list[str]:
    """The store's episode files, each writer's file id left out."""
    return sorted(re.sub(r"-\d+-[0-9a-f]+-\d+\.", ".", p.relative_to(folder).as_posix()) for p in folder.rglob("*.gz"))


def _all_bytes(folder: Path) -> bytes:
    out = b""
    for path in folder.rglob("*.gz"):
        with gzip.open(path) as handle:
            out += handle.read()
    return out


def _make_file(path: Path) -> Path:
    path.write_text("a file, not a folder")
    return path


def _flush(folder: Path) -> None:
    current().stores.get(str(folder)).flush()


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
    store = load(store_dir, answers=True)
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
    (episode,) = load(store_dir, answers=True).episodes
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
    (episode,) = load(store_dir, answers=True).episodes
    assert episode.entry["answer"]["metadata"]["error"] == "auth failed for ***"
    assert episode.entry["answer"]["response"] == {**sympy_result["response"], "output": []}  # the rest as sent
    assert KEY.encode() not in _all_bytes(store_dir)


async def test_unreachable_server_episode_is_saved_without_an_answer(
    store_dir: Path, sympy_row: dict[str, Any], use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_URL="http://127.0.0.1:9", NEMO_GYM_OUTAGE_TIMEOUT="0.5")
    try:
        await _run(sympy_row)
    finally:
        await transport.close_pools()
    _flush(store_dir)
    (episode,) = load(store_dir, answers=True).episodes
    assert episode.kind == "transport_unreachable" and episode.entry["answer"] is None


def _every_line(folder: Path) -> list[dict[str, Any]]:
    """Every line of every episode file, each parsed as one JSON object: what ``jq`` sees."""
    entries = []
    for path in sorted([*folder.rglob("*.jsonl"), *folder.rglob("*.jsonl.gz")]):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as handle:
            entries += [json.loads(line) for line in handle]
    return entries


def _ids(folder: Path) -> list[str]:
    return sorted(e.episode_id for e in load(folder).episodes)


# ----------------------------------------------------------------- a store that cannot write


@pytest.mark.parametrize("broken", ["not_a_folder", "role_folder_a_link"])
async def test_a_store_that_cannot_write_is_a_warning_not_a_failed_sample(
    fault_gym: FaultServer,
    tmp_path: Path,
    sympy_row: dict[str, Any],
    sympy_result: dict[str, Any],
    use_settings: UseSettings,
    caplog: pytest.LogCaptureFixture,
    broken: str,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if broken == "not_a_folder":  # a regular file where the folder should be (as a read-only mount)
        folder = _make_file(tmp_path / "not-a-folder")
        logged = "not saved"
    else:  # someone else's link where the store makes its train folder
        folder = tmp_path / "episodes"
        folder.mkdir()
        (folder / "train").symlink_to(elsewhere)
        logged = "is a symbolic link the store did not make"
    use_settings(NEMO_GYM_EPISODE_DIR=str(folder))
    out = await _run(sympy_row)
    store = current().stores.get(str(folder))
    store.flush()
    assert out["nemogym"]["status"] == "ok" and out["reward"] == sympy_result["reward"]
    assert (store.write_errors, store.lines_written) == (1, 0)
    assert logged in caplog.text
    assert list(elsewhere.iterdir()) == []


def test_closing_the_stores_forgets_every_store_and_stops_its_writer(tmp_path: Path) -> None:
    store = current().stores.get(str(tmp_path))
    store.add("train", {"episode_id": "a"}, None, False)
    current().stores.close()
    assert current().stores.get(str(tmp_path)) is not store
    assert _ids(tmp_path) == ["a"]  # what was queued was written first
    assert not store._thread.is_alive()


# ----------------------------------------------------------------- every episode one line


@pytest.mark.parametrize(
    "answer",
    [
        json.dumps({"reward": 1.0, "text": "a\nb"}).encode() + b"\n",  # a /run answer ending in a newline
        json.dumps({"reward": 1.0, "text": "a\nb", "nested": {"x": [1, 2]}}, indent=2).encode(),  # pretty-printed
        b'{"reward": 1.0,\r\n "text": "crlf"}',
    ],
)
def test_every_episode_is_one_line_whatever_the_servers_json_formatting(tmp_path: Path, answer: bytes) -> None:
    store = episode_store.EpisodeStore(tmp_path)
    for i in range(4):
        store.add("train", {"episode_id": f"e{i}"}, answer, True)
    store.seal("train", 1)
    store.add("train", {"episode_id": "e4"}, answer, True)
    store.close()
    assert sorted(e["episode_id"] for e in _every_line(tmp_path)) == [f"e{i}" for i in range(5)]
    loaded = load(tmp_path, answers=True)
    assert [e.entry["answer"] for e in loaded.episodes] == [json.loads(answer)] * 5
    assert loaded.problems == []


# ----------------------------------------------------------------- processes: crashes and restarts


def test_a_restart_with_the_same_pid_never_appends_to_the_file_a_killed_process_left(tmp_path: Path) -> None:
    code, _ = store_writers.run("pid-1-killed", tmp_path, "before", 10)
    assert code == -signal.SIGKILL
    (left,) = (tmp_path / "train").glob("pending-*.jsonl")
    data = left.read_bytes()
    left.write_bytes(data[: len(data) - 5000])  # the kill came in the middle of the last line
    code, counters = store_writers.run("pid-1", tmp_path, "after", 20)
    assert code == 0 and counters["write_errors"] == 0
    store = load(tmp_path)
    assert sorted(e.episode_id for e in store.episodes) == sorted(
        [f"before-{i}" for i in range(9)] + [f"after-{i}" for i in range(20)]
    )
    assert [(p.path, p.line) for p in store.problems] == [(str(left), 10)]


def test_a_full_disk_that_has_space_again_loses_only_the_episodes_it_refused(tmp_path: Path) -> None:
    code, counters = store_writers.run("disk-full-then-space", tmp_path, "w")
    assert code == 0 and counters["write_errors"] >= 1
    store = load(tmp_path)
    assert store.problems == []  # no line cut by the failed write
    assert len(store.episodes) == counters["lines_written"]
    assert {f"w-later-{i}" for i in range(5)} <= {e.episode_id for e in store.episodes}
    assert len(_every_line(tmp_path)) == counters["lines_written"]


def test_a_kill_while_compressing_then_a_second_seal_of_the_step_loses_nothing(tmp_path: Path) -> None:
    code, _ = store_writers.run("killed-compressing", tmp_path, "old", 600, 7)
    assert code == -signal.SIGKILL
    code, _ = store_writers.run("seal", tmp_path, "new", 50, 7)  # a resume from an earlier checkpoint
    assert code == 0
    store = load(tmp_path, answers=True)
    assert sorted(e.episode_id for e in store.episodes) == sorted(
        [f"old-{i}" for i in range(600)] + [f"new-{i}" for i in range(50)]
    )
    assert {e.step for e in store.episodes} == {7} and store.problems == []
    assert len(_every_line(tmp_path)) == 650  # every file whole: zcat reads each to its end


def test_two_processes_sealing_the_same_steps_at_once_lose_and_misfile_nothing(tmp_path: Path) -> None:
    steps = 5
    writers = {name: store_writers.start("seal-race", tmp_path, name, steps) for name in ("a", "b")}
    for step in range(1, steps + 1):
        while not all((tmp_path / f"ready-{name}-{step}").exists() for name in writers):
            time.sleep(0.001)
        (tmp_path / f"go-{step}").touch()
    for process in writers.values():
        out, _ = process.communicate(timeout=120)
        assert process.returncode == 0 and json.loads(out)["write_errors"] == 0
    store = load(tmp_path, answers=True)
    expected = sorted((f"{n}-s{s}-{i}", s) for n in writers for s in range(1, steps + 1) for i in range(40))
    assert sorted((e.episode_id, e.step) for e in store.episodes) == expected
    assert store.problems == []
    assert len(_every_line(tmp_path)) == len(expected)


# ----------------------------------------------------------------- symlinks and permissions


def test_the_store_writes_through_no_link_it_did_not_make(tmp_path: Path) -> None:
    folder = tmp_path / "episodes"
    (folder / "train").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"not yours\n")
    victim.chmod(0o600)
    # Links at the names a store of this process would have used before: the pending file, the step.
    (folder / "train" / f"pending-{os.getpid()}.jsonl").symlink_to(victim)
    (folder / "train" / "step-000007.jsonl.gz").symlink_to(victim)
    (folder / "train" / "step-000007.jsonl").symlink_to(victim)
    store = episode_store.EpisodeStore(folder)
    store.add("train", {"episode_id": "a"}, b'{"reward": 1.0}', True)
    store.seal("train", 7)
    store.add("train", {"episode_id": "b"}, b'{"reward": 1.0}', True)
    store.seal("train", 7)
    store.close()
    assert victim.read_bytes() == b"not yours\n"
    made = [p for p in (folder / "train").iterdir() if not p.is_symlink()]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in made)
    loaded = load(folder)
    assert sorted(e.episode_id for e in loaded.episodes) == ["a", "b"]
    assert {e.step for e in loaded.episodes} == {7}
    assert len(loaded.problems) == 3  # the links are named, not read


def test_files_are_owner_only_whatever_the_umask_allows(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = episode_store.EpisodeStore(tmp_path / "episodes")
        store.add("eval", {"episode_id": "a"}, b'{"reward": 1.0}', True)
        store.seal("eval", 1)
        store.add("eval", {"episode_id": "b"}, None, False)
        store.close()
    finally:
        os.umask(old)
    made = list((tmp_path / "episodes").rglob("*"))
    assert {p.name.split("-")[0] for p in made} == {"eval", "step", "pending"}
    assert {stat.S_IMODE(p.stat().st_mode) for p in made if p.is_file()} == {0o600}
    assert {stat.S_IMODE(p.stat().st_mode) for p in made if p.is_dir()} == {0o700}


# ----------------------------------------------------------------- the reader


def _lines(*entries: Any) -> bytes:
    return b"".join((e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n" for e in entries)


def test_a_bad_line_hides_no_later_line_and_is_named(tmp_path: Path) -> None:
    path = tmp_path / "train" / "step-000001.jsonl"
    path.parent.mkdir()
    good = {"episode_id": "g0", "record": {"turns": 3, "resolved": True}}
    path.write_bytes(
        _lines(
            good,
            b'{"episode_id": "cut", "answ',  # cut by a crash, or a full disk
            {**good, "episode_id": "g1"},
            [1, 2, 3],  # a JSON array
            {"episode_id": "bad-time", "finished_at": "yesterday"},
            {"episode_id": "bad-turns", "record": {"turns": "three", "resolved": True}},
            {"episode_id": "bad-record", "record": [1]},
            {**good, "episode_id": "g2"},
        )
    )
    store = load(tmp_path)
    # A line that is not an episode is skipped; one with a field of the wrong type is kept (the
    # views show what they can of it) and the field named.
    assert [e.episode_id for e in store.episodes] == ["g0", "g1", "bad-time", "bad-turns", "bad-record", "g2"]
    assert [(p.path, p.line) for p in store.problems] == [(str(path), line) for line in (2, 4, 5, 6, 7)]
    assert [p.reason.split(": ")[1].split(" ")[0] for p in store.problems[2:]] == [
        "finished_at",
        "record.turns",
        "record",
    ]


def test_what_is_not_a_readable_store_file_is_skipped_and_named(tmp_path: Path) -> None:
    train = tmp_path / "train"
    (train / "step-000001.jsonl").mkdir(parents=True)  # a folder named like a step file
    (train / "step-000002.jsonl.gz").symlink_to("/dev/zero")  # a link: never read
    whole = gzip.compress(_lines(*({"episode_id": f"z{i}"} for i in range(200))))
    (train / "step-000003.jsonl.gz").write_bytes(whole[: len(whole) * 2 // 3])  # a cut gzip tail
    (train / "step-000004.jsonl").write_bytes(_lines({"episode_id": "after"}))
    store = load(tmp_path)
    ids = [e.episode_id for e in store.episodes]
    assert 0 < len(ids) < 201 and ids[-1] == "after" and ids[:-1] == [f"z{i}" for i in range(len(ids) - 1)]
    assert [Path(p.path).name for p in store.problems] == [
        "step-000001.jsonl",
        "step-000002.jsonl.gz",
        "step-000003.jsonl.gz",
    ]


def test_episodes_without_an_id_are_kept_apart(tmp_path: Path) -> None:
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "step-000001.jsonl").write_bytes(_lines({"reward": 1.0}, {"reward": 0.0}, {"episode_id": ""}))
    assert [e.entry.get("reward") for e in load(tmp_path).episodes] == [1.0, 0.0, None]


def test_the_summary_reads_the_heads_not_the_answers(tmp_path: Path) -> None:
    store = episode_store.EpisodeStore(tmp_path)
    for i in range(3):
        store.add("train", {"episode_id": f"e{i}", "reward": 1.0}, store_writers.answer(f"e{i}", 1000), True)
    store.seal("train", 4)
    store.close()
    (data,) = (tmp_path / "train").glob("step-000004-*.jsonl.gz")
    data.write_bytes(b"damaged")  # the answers cannot be read any more
    summary = load(tmp_path)
    assert [(e.episode_id, e.step, e.entry["reward"]) for e in summary.episodes] == [
        (f"e{i}", 4, 1.0) for i in range(3)
    ]
    assert summary.problems == [] and all("answer" not in e.entry for e in summary.episodes)
    with_answers = load(tmp_path, answers=True)
    assert with_answers.episodes == [] and [p.path for p in with_answers.problems] == [str(data)]


# ----------------------------------------------------------------- kept from before


def test_backlog_past_the_bound_keeps_the_record_without_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(episode_store, "MAX_PENDING_BYTES", 10)
    store = episode_store.EpisodeStore(tmp_path)
    store.add("train", {"episode_id": "big"}, b'{"reward": 1.0, "pad": "' + b"x" * 100 + b'"}', True)
    store.close()
    (episode,) = load(tmp_path, answers=True).episodes
    assert episode.entry["answer"] is None and "answer_dropped" in episode.entry
    assert store.answers_dropped == 1


def test_a_step_logged_twice_keeps_both_batches(tmp_path: Path) -> None:
    store = episode_store.EpisodeStore(tmp_path)
    store.add("eval", {"episode_id": "a"}, None, False)
    store.seal("eval", 5)
    store.add("eval", {"episode_id": "b"}, None, False)
    store.seal("eval", 5)
    store.close()
    loaded = load(tmp_path, answers=True)
    assert [(e.episode_id, e.step, e.entry["answer"]) for e in loaded.episodes] == [("a", 5, None), ("b", 5, None)]


def test_session_id_is_the_miles_session() -> None:
    assert episode_store.session_id("http://10.0.0.1:3000/sessions/abc-1") == "abc-1"
    assert episode_store.session_id("http://10.0.0.1:3000/") is None


def test_every_episode_written_survives_a_killed_process(tmp_path: Path) -> None:
    code, _ = store_writers.run("pid-1-killed", tmp_path, "e", 40)
    assert code == -signal.SIGKILL
    store = load(tmp_path, answers=True)
    assert [e.episode_id for e in store.episodes] == [f"e-{i}" for i in range(40)]
    assert store.episodes[0].step is None and store.episodes[39].entry["answer"]["episode"] == "e-39"
    assert store.problems == []


def test_the_episodes_command_names_what_it_skipped_after_its_table(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from miles_nemogym.cli.main import app

    path = tmp_path / "train" / "step-000001.jsonl"
    path.parent.mkdir()
    path.write_bytes(_lines({"episode_id": "a"}, b"{cut", {"episode_id": "b"}))
    result = CliRunner().invoke(app, ["episodes", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1].split()[:3] == ["train", "1", "2"]
    assert lines[-1] == f"warning: {path}:2: skipped: not a whole JSON line (cut by a crash?)"


# ----------------------------------------------------------------- filings (fully async)


def test_a_filing_moves_episodes_to_the_step_that_trained_them_or_marks_them_not_trained(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    store = episode_store.EpisodeStore(folder)
    for name in "abc":
        store.add("train", {"episode_id": name}, None, False)
    store.seal("train", 0, trained=["a"])
    store.not_trained("train", ["c"], "stale")
    store.add("train", {"episode_id": "d"}, None, False)
    store.add("train", {"episode_id": "e"}, None, False)  # its group still in flight
    store.seal("train", 1, trained=["b", "d"])
    store.close()
    loaded = load(folder)
    assert loaded.problems == []
    assert sorted((e.episode_id, e.step, e.not_trained) for e in loaded.episodes) == [
        ("a", 0, None),
        ("b", 1, None),
        ("c", 1, "stale"),
        ("d", 1, None),
        ("e", 1, UNFILED),
    ]
    filings = sorted(p.name for p in (folder / "train").glob("*.filing"))
    assert [name.split("-")[1] for name in filings] == ["000000", "000001"]
    assert all(stat.S_IMODE((folder / "train" / n).stat().st_mode) == 0o600 for n in filings)
    listed = episodes_cli(folder, "--step", "1")
    assert "not trained (stale)" in listed and " a " not in listed
    episodes_cli(folder, "--step", "1", "--html", str(tmp_path / "page.html"))
    assert "step 1 not trained (stale)" in (tmp_path / "page.html").read_text()


def episodes_cli(folder: Path, *args: str) -> str:
    from typer.testing import CliRunner

    from miles_nemogym.cli.main import app

    result = CliRunner().invoke(app, ["episodes", str(folder), *args], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    return result.output


def test_a_bad_filing_line_or_a_linked_filing_is_skipped_and_named(tmp_path: Path) -> None:
    train = tmp_path / "train"
    train.mkdir()
    (train / "step-000001-1-ab-1.jsonl").write_bytes(_lines(*({"episode_id": i} for i in "abcde")))
    (train / "step-000002-1-ab-2.filing").write_bytes(
        _lines(
            {"episode_id": "a", "trained": True},
            b"not json",
            {"episode_id": "b", "trained": "yes"},  # the wrong type
            [1],
            {"episode_id": "c", "trained": False, "reason": "stale"},
        )
        + b'{"episode_id": "d", "trai'  # cut
    )
    elsewhere = tmp_path / "planted.filing"
    elsewhere.write_bytes(_lines({"episode_id": "e", "trained": True}))
    (train / "step-000003-1-ab-3.filing").symlink_to(elsewhere)  # never followed
    loaded = load(tmp_path)
    assert sorted((e.episode_id, e.step, e.not_trained) for e in loaded.episodes) == [
        ("a", 2, None),
        ("b", 1, UNFILED),  # where it was sealed, no step known to have trained it
        ("c", 2, "stale"),
        ("d", 1, UNFILED),
        ("e", 1, UNFILED),
    ]
    assert [(Path(p.path).name, p.line) for p in loaded.problems] == [
        ("step-000003-1-ab-3.filing", None),
        ("step-000002-1-ab-2.filing", 2),
        ("step-000002-1-ab-2.filing", 3),
        ("step-000002-1-ab-2.filing", 4),
        ("step-000002-1-ab-2.filing", 6),
    ]
    assert all(p.reason.startswith("skipped") for p in loaded.problems)
