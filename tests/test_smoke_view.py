"""The smoke run's table, per-episode lines and JSON, from episodes shaped as the real run returns them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.smoke._swe import SmokeEpisode, SmokeReport, expected_offline
from miles_nemogym.store.views import OFFLINE_REASON

# The failure reason the agent records for django/pylint without network (as a real smoke run returned it).
OFFLINE = (
    "server error: requests.exceptions.ConnectionError: HTTPSConnectionPool(host='raw.githubusercontent.com', "
    "port=443): Max retries exceeded with url: /django/django/419a78300f7cd27611196e1e464d50fd0385ff27/tests/"
    "requirements/py3.txt (Caused by NameResolutionError(\"HTTPSConnection(host='raw.githubuserc…"
)
TIMEOUT = "no answer within NEMO_GYM_RUN_TIMEOUT=3600 s " + "with a long explanation " * 8


def _failed(instance_id: str, repo: str, kind: str, reason: str) -> SmokeEpisode:
    record = {"status": "failed", "failure_kind": kind, "failure_reason": reason, "mask_sample": True,
              "turns": 0, "tool_calls": 0, "patch_applied": None, "fail_to_pass": None, "elapsed_s": 34.3}  # fmt: skip
    return SmokeEpisode(instance_id, repo, {"reward": 0.0, "nemogym": record}, 3)


def _graded(instance_id: str, repo: str, f2p_passed: int = 0, f2p_failed: int = 1) -> SmokeEpisode:
    # The reward as NEMO_GYM_REWARD_MODE=partial gives it: the FAIL_TO_PASS pass fraction.
    record = {"status": "ok", "failure_kind": None, "failure_reason": None, "mask_sample": False, "turns": 3,
              "tool_calls": 3, "patch_applied": True, "fail_to_pass": {"passed": f2p_passed, "failed": f2p_failed},
              "elapsed_s": 36.7}  # fmt: skip
    return SmokeEpisode(instance_id, repo, {"reward": f2p_passed / (f2p_passed + f2p_failed), "nemogym": record}, 3)


EPISODES = [
    _failed("django__django-10973", "django/django", "agent_run_error", OFFLINE),
    _failed("pylint-dev__pylint-4551", "pylint-dev/pylint", "agent_run_error", OFFLINE.replace("django", "pylint")),
    _graded("sphinx-doc__sphinx-8595", "sphinx-doc/sphinx"),
    _failed("sympy__sympy-20916", "sympy/sympy", "agent_timeout", TIMEOUT),
    _graded("scikit-learn__scikit-learn-14141", "scikit-learn/scikit-learn", 1, 2),  # a partial reward, 1/3
]


def _render(width: int = 80) -> str:
    console = Console(width=width, record=True, color_system=None)
    table, _notes = SmokeReport(EPISODES).table()
    console.print(table)
    return console.export_text()


def test_the_table_fits_80_columns_and_no_instance_id_wraps() -> None:
    text = _render(80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    for episode in EPISODES:
        rows = [line for line in lines if episode.instance_id in line]
        assert len(rows) == 1, f"{episode.instance_id} is not whole on one line:\n{text}"


def test_cells_are_short_and_consistent() -> None:
    lines = _render().splitlines()
    django = next(line for line in lines if "django__django-10973" in line).split()
    # instance, verdict: its failure kind (its note's number wraps under it at 80 columns), turns as the
    # record counts them, calls 3, patch, F2P, reward 0.0
    assert django[1:] == ["agent_run_error", "0", "3", "-", "-", "0.0"]
    sphinx = next(line for line in lines if "sphinx-doc__sphinx-8595" in line).split()
    assert sphinx[1:] == ["unresolved", "3", "3", "yes", "0/1", "0.0"]
    sklearn = next(line for line in lines if "scikit-learn__scikit-learn-14141" in line).split()
    assert sklearn[1:] == ["unresolved", "3", "3", "yes", "1/2", "0.3333"]  # store.views.reward_text
    wide = _render(120).splitlines()
    assert next(line for line in wide if "django__django-10973" in line).split()[1:3] == ["agent_run_error", "[1]"]
    assert "None" not in "\n".join(lines)


def test_reasons_are_numbered_footnotes_in_full_and_offline_ones_share_one() -> None:
    numbers, texts = SmokeReport(EPISODES).notes()
    assert numbers == [1, 1, None, 2, None]
    assert texts == [f"agent_run_error: {OFFLINE_REASON}", f"agent_timeout: {TIMEOUT}"]


def test_one_line_per_finished_episode() -> None:
    assert EPISODES[0].line() == ("[red]✗[/red] django__django-10973  set aside: no network (expected), 34 s")
    assert EPISODES[2].line() == ("[green]✓[/green] sphinx-doc__sphinx-8595  unresolved: 3 turns, reward 0.0, 37 s")
    assert EPISODES[3].line().endswith("set aside: agent_timeout, 34 s")
    assert EPISODES[4].line().endswith("  unresolved: 3 turns, reward 0.3333, 37 s")


def test_json_report_holds_every_episode_with_its_note(tmp_path: Path) -> None:
    report = SmokeReport(episodes=list(EPISODES), data_path=tmp_path / "p.jsonl")
    document: dict[str, Any] = json.loads(json.dumps(report.json()))
    assert document["chain_worked"] is True
    verdicts = ["agent_run_error", "agent_run_error", "unresolved", "agent_timeout", "unresolved"]
    assert [e["verdict"] for e in document["episodes"]] == verdicts
    assert [e["set_aside"] for e in document["episodes"]] == [True, True, False, True, False]
    assert [e["expected_offline"] for e in document["episodes"]] == [True, True, False, False, False]
    assert document["episodes"][3]["note"] == f"agent_timeout: {TIMEOUT}"
    assert document["episodes"][2]["nemogym"]["fail_to_pass"] == {"passed": 0, "failed": 1}
    assert document["prompt_data"] == str(tmp_path / "p.jsonl")


def test_the_rows_expected_offline_are_django_and_pylint(gym_example_rows: list[dict[str, Any]]) -> None:
    positions = expected_offline([row["repo"] for row in gym_example_rows])
    assert sorted(gym_example_rows[i]["instance_id"] for i in positions) == [
        "django__django-10973",
        "pylint-dev__pylint-4551",
    ]


def test_smoke_help_names_the_build_cache_and_interpreter() -> None:
    for command in ("smoke", "serve"):
        result = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
        assert result.exit_code == 0
        for phrase in ("first run builds", "~/.cache/miles-nemogym", "MILES_NEMOGYM_CACHE", "MILES_NEMOGYM_GYM_PYTHON"):
            assert phrase in result.output, (command, phrase)
    assert "--json" in CliRunner().invoke(app, ["smoke", "--help"]).output


def test_verdict_turns_and_reward_read_as_the_episode_store_s_views_show_them(tmp_path: Path) -> None:
    """One vocabulary: smoke's table cell is what `episodes`, `--show` and the HTML page show."""
    from miles_nemogym.store._browser import episode_list_text, episode_parts
    from miles_nemogym.store._page import render_html
    from miles_nemogym.store._reader import Store, StoredEpisode

    table = _render(120).splitlines()
    for episode in EPISODES:
        stored = StoredEpisode(
            {"episode_id": episode.instance_id, "instance_id": episode.instance_id,
             "reward": episode.result["reward"], "record": episode.result["nemogym"]},
            0, "train",
        )  # fmt: skip
        cells = next(line for line in table if episode.instance_id in line).split()
        turns, reward = str(episode.result["nemogym"]["turns"]), cells[-1]
        assert cells[1] == stored.kind and cells[-5] == turns
        assert episode_list_text([stored], 200).splitlines()[1].split()[-3:] == [reward, turns, stored.kind]
        assert f"verdict: {stored.kind}   reward {reward}   " in str(episode_parts(stored)[1])
        assert f"in the trajectory the server returned: {turns} turns, " in str(episode_parts(stored)[2])
        page = render_html(Store([stored]), "t")
        assert f">{stored.kind}</span> · reward {reward} · turns {turns} · " in page
    assert "0.3333" in table[-1] or any("scikit-learn" in line and "0.3333" in line for line in table)
