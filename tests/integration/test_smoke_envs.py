"""``miles-nemogym smoke --env``: the real resources servers (and blackjack's gymnasium agent
with the routing model) play their shipped rows through the agent function, gold 1.0 and
wrong 0.0, one line per episode and a table per environment at 80 columns, the episode store
``episodes`` reads, and nothing left behind; by the names of NeMo-Gym's catalog (its
``environments/`` folders, ``resources_servers/NAME``), refusing by name what cannot run here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.smoke._answers import GOLD, PLAIN, WRONG
from miles_nemogym.smoke._environments import EnvironmentEpisode
from miles_nemogym.store import _reader as reader
from tests.support.env_scripts import SMOKED

pytestmark = pytest.mark.integration

GRADED = ("mcqa", "workplace_assistant", "xlam_fc", "calendar_v2", "arc_agi")
"""calendar_v2 is a folder of the wheel's environments/ alone; the others are catalog names too."""


@pytest.mark.timeout(900)
def test_smoke_env_plays_gold_and_wrong_answers_through_the_real_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    store, report = tmp_path / "store", tmp_path / "smoke.json"
    # The catalog's spelling of a resources server is its short name.
    args = [f"--env={'resources_servers/' * (name == 'xlam_fc')}{name}" for name in (*GRADED, "blackjack")]
    done = CliRunner().invoke(app, ["smoke", *args, "--limit", "2", "--episode-dir", str(store), "--json", str(report)])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    # Over 80 columns only a path longer than the line, whole on its own, and the command to copy.
    long = [line for line in lines if len(line) > 80 and len(line.split()) > 1]
    long = [line for line in long if not line.startswith("  miles-nemogym episodes ")]
    assert not long  # the command to copy is the one line never wrapped
    for name in (*GRADED, "blackjack"):
        assert any(line.startswith(f"{name}: ") and " episode" in line for line in lines), name  # its table
    assert lines[-1] == f"  miles-nemogym episodes {store}"
    assert not any(temp.iterdir())  # the servers' folder is removed after a run that worked

    result = json.loads(report.read_text())
    assert result["chain_worked"] is True
    episodes = result["episodes"]
    for name in GRADED:
        mine = [e for e in episodes if e["environment"] == name]
        assert sorted(e["answer"] for e in mine) == [GOLD, GOLD, WRONG, WRONG], name
        for episode in mine:
            assert episode["problem"] is None, episode
            assert episode["nemogym"]["mask_sample"] is False
            expected = (1.0, "passed") if episode["answer"] == GOLD else (0.0, "failed")
            assert (episode["reward"], episode["verdict"]) == expected, episode
            assert f"✓ {episode['task_id']}  {episode['answer']} {episode['verdict']}, reward" in done.output
    # blackjack's rows carry no gold: one plain reply each, played by its own agent server's /run.
    games = [e for e in episodes if e["environment"] == "blackjack"]
    assert [e["answer"] for e in games] == [PLAIN, PLAIN]
    assert all(not e["nemogym"]["mask_sample"] and -1.0 <= e["reward"] <= 1.0 for e in games), games

    browsed = CliRunner().invoke(app, ["episodes", str(store)])
    assert browsed.exit_code == 0, browsed.output
    row = next(line for line in browsed.output.splitlines() if line.startswith("train"))
    assert row.split()[:3] == ["train", "0", str(len(episodes))]  # one step, every episode in it

    # A tool call shows as the tool's name and arguments, as the policy made it.
    reply = next(e for e in episodes if e["environment"] == "workplace_assistant" and e["answer"] == GOLD)
    (episode_id,) = [
        e.episode_id
        for e in reader.load(store).episodes
        if e.instance_id == reply["task_id"] and e.entry.get("smoke_answer") == GOLD  # which answer it played
    ]
    shown = CliRunner().invoke(app, ["episodes", str(store), "--show", episode_id])
    assert shown.exit_code == 0, shown.output
    assert "  $ email_reply_email {" in shown.output, shown.output

    # A gold answer that fails, or a wrong one that passes, is what smoke flags (exit 1).
    gold = next(e for e in episodes if e["answer"] == GOLD)
    as_wrong = EnvironmentEpisode(
        gold["environment"], gold["task_id"], WRONG, {"reward": 1.0, "nemogym": gold["nemogym"]}
    )
    assert as_wrong.surprise == "a wrong answer scored 1.0, a pass"


@pytest.mark.timeout(600)
def test_smoke_env_plays_the_catalogs_calendar_and_refuses_wordle_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    # calendar: environments/calendar and resources_servers/calendar, one server, agent and rows.
    assert "calendar" in SMOKED
    report = tmp_path / "smoke.json"
    args = ["--env", "calendar", "--limit", "1", "--episode-dir", str(tmp_path / "store"), "--json", str(report)]
    done = CliRunner().invoke(app, ["smoke", *args])
    assert done.exit_code == 0, done.output
    episodes = json.loads(report.read_text())["episodes"]
    assert sorted((e["environment"], e["answer"], e["reward"]) for e in episodes) == [
        ("calendar", GOLD, 1.0),
        ("calendar", WRONG, 0.0),
    ], episodes
    # wordle's server reads a word list the wheel lacks: refused before anything starts, with the reason.
    refused = CliRunner().invoke(app, ["smoke", "--env", "wordle"])
    assert refused.exit_code == 2, refused.output
    assert "'wordle'" in refused.output and "guesses.txt" in " ".join(refused.output.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.json", "store"]  # no server folder left
