"""README's table of nemo-gym's environments is what ``scripts/environments_table.py`` prints
from the pinned wheel, and its categories say what serve does with each."""

from __future__ import annotations

from pathlib import Path

from tests.support import environments_table as script

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_table_is_the_scripts_output() -> None:
    text = (ROOT / "README.md").read_text()
    rerun = "re-run `python scripts/environments_table.py readme` and paste its output into README.md"
    assert script.block(text, "readme") == script.readme(script.rows()), rerun


def test_each_of_the_143_environments_has_one_row_with_a_reason_where_refused() -> None:
    rows = {r.name: r for r in script.rows()}
    assert len(rows) == 143
    assert {r.status for r in rows.values()} <= set(script.ORDER)
    assert all(r.needs for r in rows.values() if r.status == script.REFUSED)
    assert rows["spartqa"].status == script.TESTED  # its dataset entries no longer stop serve
    assert rows["bigcodebench"].status == script.SIMPLE
    # A judged environment graded through the stand-in judge by a test: tested, the judge still named.
    assert rows["abstention"].status == script.TESTED_JUDGED and "--judge-url" in rows["abstention"].needs
    assert rows["mcqa"].status == script.TESTED
    assert rows["equivalence_llm_judge"].status == script.TESTED_JUDGED  # in the catalog test's JUDGED_TOGETHER
    assert rows["bbq"].status == rows["xstest"].status == script.JUDGE
    # Routed agents: run end to end where tests/support/routed_agents.py drives them, else not run here.
    assert rows["blackjack"].status == script.TESTED_ROUTED and rows["blackjack"].agent == "`gymnasium_agent`"
    assert rows["openair_congestion"].status == script.TESTED_ROUTED
    assert rows["swe_pivot"].status == script.TESTED_ROUTED and rows["swe_pivot"].agent == "`tool_simulation_agent`"
    assert rows["grl_sokoban"].status == script.ROUTED and rows["grl_sokoban"].agent == "`gymnasium_agent`"
    assert "`resources_servers/wordle/data/guesses.txt`" in rows["wordle"].needs  # a word list it downloads
    assert "harbor_agent` drops the rollout id" in rows["legal_agent_bench"].needs
    assert "finance_agent` drops the rollout id" in rows["finance_sec_search"].needs
    assert "beyond PyPI" in rows["instruction_following"].needs
