"""``miles-nemogym environments`` over nemo-gym 0.7.0's real catalog, read in the server venv:
every entry ``gym --json list environments`` prints, by the same names, with what this package
does with it; one entry shown whole; answered from the cache afterwards."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.gym.catalog import BENCHMARK_PREPARED, BENCHMARK_SHIPPED, entry_support, load_catalog
from miles_nemogym.gym.venv import ensure_gym_venv
from tests.support import environments_table as table

pytestmark = pytest.mark.integration


def _cli(*args: str) -> str:
    result = CliRunner().invoke(app, ["environments", *args], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_every_catalog_entry_is_listed_by_its_own_name_with_what_this_package_does() -> None:
    gym = ensure_gym_venv()
    printed = subprocess.run(
        [str(gym.path / "bin" / "gym"), "--json", "list", "environments"],
        capture_output=True, text=True, check=True, cwd=gym.site_packages,
    )  # fmt: skip
    theirs = {(e["name"], e["kind"]) for e in json.loads(printed.stdout)}
    ours = json.loads(_cli("--json"))
    assert {(e["name"], e["kind"]) for e in ours} == theirs
    by_name = {(e["name"], e["kind"]): e for e in ours}
    assert by_name[("resources_servers/mcqa", "environment")]["here"]["status"].startswith("simple_agent")
    aime = by_name[("aime25", "benchmark")]
    assert aime["datasets"][0]["num_repeats"] == 32 and aime["prompt_config"].endswith("math.yaml")
    listed = _cli("--kind", "benchmark")
    assert listed.startswith("benchmarks (") and "environments (" not in listed
    assert all(len(line) <= 80 for line in listed.splitlines())


def test_one_entry_shows_its_parts_and_the_commands_to_try_it() -> None:
    shown = _cli("MCQA")
    assert shown.startswith("resources_servers/mcqa (environment)")
    assert "miles-nemogym smoke --env mcqa" in shown and "agent: simple_agent" in shown
    assert "miles-nemogym smoke --env calendar_v2" in _cli("calendar_v2")
    result = CliRunner().invoke(app, ["environments", "arena"])
    assert result.exit_code == 2
    assert "resources_servers/arena/lmarena_v2" in result.stderr


def test_the_cached_catalog_answers_without_asking_the_registry_again(monkeypatch: pytest.MonkeyPatch) -> None:
    _cli("--json")  # cached by now

    def no_registry(*args: object, **kwargs: object) -> None:
        raise AssertionError("the registry was asked again")

    monkeypatch.setattr(subprocess, "run", no_registry)
    shown = _cli("aime25")
    assert "repeats: 32" in shown
    assert "miles-nemogym convert --env aime25=PREPARED.jsonl --output aime25.jsonl" in shown
    assert "--eval-data aime25=aime25.jsonl" in shown and "miles-nemogym serve --env math_with_judge" in shown
    assert all(len(line) <= 80 for line in shown.splitlines())


def test_the_docs_table_is_the_scripts_output_over_the_whole_catalog() -> None:
    entries = load_catalog(ensure_gym_venv())
    text = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    rerun = "re-run `python scripts/environments_table.py docs` and paste its output into docs/environments.md"
    assert table.block(text, "docs") == table.docs(entries), rerun
    rows = {r.name: r for r in table.catalog_rows(entries)}
    assert len(rows) == len(entries) == 385
    assert rows["resources_servers/mcqa"].status == table.TESTED
    assert rows["gpqa"].status == table.BENCHMARK_TESTED and "graded by `gpqa` (`mcqa` with" in rows["gpqa"].needs
    # Benchmarks of other agents: refused for nemo-gym's reason (gdpval: its own rollout driver),
    # or played by their environment's agent (gdp_pdf).
    assert rows["gdpval"].status == table.REFUSED and "rollout driver" in rows["gdpval"].needs
    assert rows["gdp_pdf"].status == table.BENCHMARK_TESTED
    assert rows["aime25"].status == rows["gsm8k"].status == table.BENCHMARK_TESTED
    assert rows["aime24"].status == BENCHMARK_PREPARED
    # The benchmark whose data ships, and its grader: played here through the stand-in judge.
    [aegis] = [e for e in entries if e.name == "aegis_v4_safety"]
    assert entry_support(aegis).status == BENCHMARK_SHIPPED and rows[aegis.name].status == table.BENCHMARK_TESTED
    assert rows["resources_servers/aegis_v4_safety"].status == table.TESTED_JUDGED
    # The harness environments: opencode's, kilocode's and cline's run here, every other one refused.
    harnesses = rows["opencode_math"].status, rows["kilocode_math"].status, rows["cline_math"].status
    assert harnesses == (table.TESTED_ROUTED,) * 3
    assert rows["claude_code_math"].status == rows["hermes_reasoning_gym"].status == table.REFUSED
    # environments/ folders by their own names: played here, routed, or refused with the reason.
    assert rows["calendar_v2"].status == rows["arc_agi"].status == table.TESTED
    assert rows["blackjack"].status == table.TESTED_ROUTED and rows["wordle"].status == table.REFUSED
