"""``miles-nemogym smoke`` leaves an episode store ``episodes`` reads, names the command that
reads it, and removes its temporary folder unless ``--keep`` (server stood in by a loopback
``/run`` server with nemo-gym's own results; the real chain: tests/integration)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.smoke import _swe as smoke
from miles_nemogym.store import _reader as reader
from tests.support.loopback_gym import CRASH_CAUSE, LoopbackGym

DJANGO = "django__django-10973"


@pytest.fixture
def folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The test's folder as the working directory and the temporary-folder root; smoke's
    server stood in, each episode making 2 policy calls, django's eval crashing."""
    monkeypatch.setattr(smoke, "GymServer", LoopbackGym)
    monkeypatch.setattr(smoke, "ensure_gym_venv", lambda sandbox, progress: None)
    monkeypatch.setattr(LoopbackGym, "policy_calls", 2)
    monkeypatch.setattr(LoopbackGym, "crashed", frozenset({DJANGO}))
    monkeypatch.setattr(LoopbackGym, "servers", [])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    monkeypatch.delenv("NEMO_GYM_EPISODE_DIR", raising=False)
    (tmp_path / "tmp").mkdir()
    yield tmp_path


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, [*map(str, args)])


def django_id(store: Path) -> str:
    (episode,) = [e for e in reader.load(store).episodes if e.instance_id == DJANGO]
    return episode.episode_id


def test_smoke_writes_a_store_episodes_reads_and_removes_its_temporary_folder(folder: Path) -> None:
    done = invoke("smoke")
    assert done.exit_code == 0, done.output
    # The store is in the working folder, as README says; the hint names it absolute, to run from anywhere.
    assert done.output.rstrip().endswith(f"miles-nemogym episodes {folder / 'miles-nemogym-smoke-episodes'}")
    assert list((folder / "tmp").iterdir()) == []  # the server's folder is gone
    assert "--keep keeps it" in done.output
    table = invoke("episodes", "miles-nemogym-smoke-episodes")
    assert table.exit_code == 0, table.output
    row = next(line for line in table.output.splitlines() if line.startswith("train"))
    assert row.split()[:4] == ["train", "0", "5", "4"]  # step 0: five episodes, four valid
    store = Path("miles-nemogym-smoke-episodes")
    shown = invoke("episodes", store, "--show", django_id(store))
    assert CRASH_CAUSE in shown.output
    assert "requests the policy answered (counted by the run, not the server): 2\n" in shown.output
    assert "trajectory file" not in shown.output  # removed with the folder: not pointed at


def test_keep_keeps_the_folder_and_the_store_names_the_servers_trajectory(folder: Path) -> None:
    done = invoke("smoke", "--keep", "--limit", "3")
    assert done.exit_code == 0, done.output
    (kept,) = (folder / "tmp").iterdir()
    assert kept.name.startswith("miles-nemogym-smoke-")
    assert f"server log: {kept / 'gym' / 'server.log'}\n" in done.output
    store = Path("miles-nemogym-smoke-episodes")
    shown = invoke("episodes", store, "--show", django_id(store))
    line = next(line for line in shown.output.splitlines() if "the server's trajectory file: " in line)
    trajectory = Path(line.split("the server's trajectory file: ", 1)[1])
    assert trajectory.is_file() and kept in trajectory.parents and trajectory.name.startswith(DJANGO)


def test_the_store_is_the_variables_and_each_run_is_the_next_step(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_GYM_EPISODE_DIR", str(folder / "runs"))
    for _ in range(2):
        done = invoke("smoke", "--limit", "2", "--json", folder / "smoke.json")
        assert done.exit_code == 0, done.output
    assert done.output.rstrip().endswith(f"miles-nemogym episodes {folder / 'runs'}")
    assert "as train step 1;" in " ".join(done.output.split())
    document = json.loads((folder / "smoke.json").read_text(encoding="utf-8"))
    assert (document["episode_store"], document["episode_store_step"]) == (str(folder / "runs"), 1)
    # smoke's own folder is removed after a run that worked (no --keep): the report names none of it.
    assert (document["prompt_data"], document["results_dir"], document["server_log"]) == (None, None, None)
    table = invoke("episodes", folder / "runs").output
    steps = [line.split()[1] for line in table.splitlines() if line.startswith("train")]
    assert steps == ["0", "1"]
    assert not (folder / "miles-nemogym-smoke-episodes").exists()


def test_a_store_that_cannot_be_written_is_said(folder: Path) -> None:
    (folder / "a-file").write_text("not a folder")
    done = invoke("smoke", "--limit", "2", "--episode-dir", folder / "a-file")
    assert done.exit_code == 0, done.output  # the chain worked; the store did not
    said = " ".join(done.output.split())
    assert f"the episode store {folder / 'a-file'} could not write 2 episodes or seals" in said


@pytest.mark.parametrize("form", [(), ("--env", "mcqa")], ids=["swe", "environment"])
def test_json_through_a_planted_link_is_refused_before_anything_runs(folder: Path, form: tuple[str, ...]) -> None:
    target = folder / "precious.txt"
    target.write_text("keep me\n")
    link = folder / "smoke.json"
    link.symlink_to(target)
    done = invoke("smoke", *form, "--limit", "1", "--json", link)
    assert done.exit_code == 2, done.output
    assert f"--json {link} is a symbolic link" in " ".join(done.output.split())
    assert target.read_text() == "keep me\n" and link.is_symlink()
    assert LoopbackGym.servers == []  # no server was started
