"""``smoke --env``'s parts without servers: the answers read from each shipped row, the policy
playing them, names refused before anything starts, and the report's layout at 80 columns.
The real chain (resources servers, agent servers, the store): tests/integration/test_smoke_envs.py."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from rich.console import Console
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.gym.environments import plan
from miles_nemogym.smoke import _environments as smoke_envs
from miles_nemogym.smoke._answers import GOLD, WRONG, answers
from miles_nemogym.smoke._environments import EnvironmentEpisode, EnvironmentSmokeReport, shipped_rows
from miles_nemogym.smoke._policy import FINAL_ANSWER, Answer, RecordingPolicy
from tests.support.environment_rows import shipped_rows as raw_rows

RULED = ("mcqa", "math_with_judge", "equivalence_rule", "xlam_fc", "workplace_assistant", "example_multi_step")


@pytest.mark.parametrize("server", RULED)
def test_every_shipped_row_of_a_ruled_server_gets_a_gold_and_a_different_wrong_answer(server: str) -> None:
    rows = raw_rows(server)
    assert rows  # each row below must find its rule
    for row in rows:
        found = answers(server, row)
        assert set(found) == {GOLD, WRONG}, row
        assert found[GOLD] != found[WRONG]


def test_answers_say_what_the_row_holds() -> None:
    mcqa = raw_rows("mcqa")[0]
    found = answers("mcqa", mcqa)
    assert found[GOLD] == (Answer(content=f"The answer is \\boxed{{{mcqa['expected_answer']}}}"),)
    assert mcqa["expected_answer"] not in (found[WRONG][0].content or "").split("{")[1]
    xlam = raw_rows("xlam_fc")[0]
    calls = found_calls = answers("xlam_fc", xlam)[GOLD][0].tool_calls
    assert [name for name, _ in found_calls] == [call["name"] for call in xlam["expected_answers"]]
    assert [dict(arguments) for _, arguments in calls] == [call["arguments"] for call in xlam["expected_answers"]]
    # A server without a rule, or a row without its gold, gets none: smoke plays a plain reply.
    assert answers("code_gen", raw_rows("code_gen")[0]) == {}
    assert answers("mcqa", {"options": [{"A": "x"}]}) == {}
    assert answers("workplace_assistant", {"ground_truth": []}) == {}


async def test_the_policy_plays_a_sessions_answers_then_ends_the_loop() -> None:
    played = (Answer(tool_calls=(("lookup", {"q": "x"}), ("other", {}))), Answer(content="It is B."))
    body = {"model": "policy", "messages": [{"role": "user", "content": "?"}]}
    async with RecordingPolicy() as policy, aiohttp.ClientSession() as client:
        url = policy.session_url("s")
        policy.configure_session("s", answers=played)
        said = []
        for _ in range(3):
            async with client.post(f"{url}/v1/chat/completions", json=body) as response:
                assert response.status == 200
                said.append((await response.json())["choices"][0])
    first, second, third = said
    assert first["finish_reason"] == "tool_calls"
    calls = first["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("lookup", {"q": "x"}),
        ("other", {}),
    ]
    assert (second["finish_reason"], second["message"]["content"]) == ("stop", "It is B.")
    assert "tool_calls" not in second["message"]
    assert third["message"]["content"] == FINAL_ANSWER.content


def test_shipped_rows_are_converted_as_convert_writes_them() -> None:
    (mcqa,) = plan(["mcqa"])
    rows = shipped_rows(mcqa, 2)
    assert len(rows) == 2
    raw, row = rows[0]
    assert row["metadata"]["nemogym_env"] == "mcqa"
    assert row["metadata"]["nemogym_task_id"] == f"mcqa/{raw['uuid']}"
    assert row["prompt"][-1]["role"] == "user"


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["smoke", *args])


def test_a_mistyped_or_refused_environment_is_an_error_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_: Any, **__: Any) -> None:
        raise AssertionError("nothing starts for a refused --env")

    monkeypatch.setattr(smoke_envs, "ensure_gym_venv", never)
    typo = invoke("--env", "mcq")
    assert typo.exit_code == 2, typo.output
    assert "error: --env:" in typo.output and "mcqa" in typo.output  # the close match
    judged = invoke("--env", "abstention")
    assert judged.exit_code == 2, judged.output
    assert "abstention" in judged.output and "judge" in judged.output


def test_an_environment_without_rows_fails_before_starting_and_leaves_no_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where smoke makes its folder
    out = invoke("--env", "gpqa")  # a benchmark nemo-gym ships no example rows for
    assert out.exit_code == 2, out.output
    assert "ships no example rows" in " ".join(out.output.split())
    assert "logs" not in out.output and list(tmp_path.iterdir()) == []


def _episode(task: str, answer: str, reward: float, *, masked: bool = False) -> EnvironmentEpisode:
    record = {"status": "failed" if masked else "ok", "failure_kind": "resources_server_error" if masked else None,
              "failure_reason": "verify answered 500" if masked else None, "mask_sample": masked, "turns": 1,
              "tool_calls": 0, "elapsed_s": 0.4, "environment": "mcqa"}  # fmt: skip
    return EnvironmentEpisode("mcqa", task, answer, {"reward": reward, "nemogym": record}, 1)


LONG = "mcqa/3c26f339-4b88-54be-b72a-e9c438ca6335-with-a-longer-suffix-than-any-shipped"


def test_the_report_reads_at_80_columns_and_flags_what_did_not_come_back_as_expected() -> None:
    episodes = [
        _episode(LONG, GOLD, 1.0),
        _episode(LONG, WRONG, 0.0),
        _episode("mcqa/2", GOLD, 0.0),  # gold that failed: the chain is broken
        _episode("mcqa/2", WRONG, 1.0),  # wrong that passed
        _episode("mcqa/3", GOLD, 0.0, masked=True),
        _episode("mcqa/4", GOLD, 0.99996),  # partial credit, not a pass: shown as store.views.reward_text does
    ]
    (mcqa,) = plan(["mcqa"])
    report = EnvironmentSmokeReport(episodes=episodes, plans=[mcqa])
    assert not report.chain_worked
    assert [e.surprise is None for e in episodes] == [True, True, False, False, False, False]
    tables, notes = report.tables()
    assert notes == [
        "mcqa/2: the row's gold answer scored 0.0, not a pass",
        "mcqa/2: a wrong answer scored 1.0, a pass",
        "mcqa/3: set aside (resources_server_error): verify answered 500",
        "mcqa/4: the row's gold answer scored 0.9999, not a pass",
    ]
    assert episodes[5].line().endswith("mcqa/4  gold failed, reward 0.9999, 0.4 s")
    for width in (80, 120):
        console = Console(width=width, record=True, color_system=None)
        for table in tables:
            console.print(table)
        for episode in episodes:
            console.print(episode.line(), highlight=False)
        lines = console.export_text().splitlines()
        assert all(len(line) <= width for line in lines), lines
        text = "\n".join(lines)
        assert "failed [1]" in text and "passed [2]" in text and "resources_server_error" in text
        assert re.search(r"failed \[4\] +1 +1 +0\.9999 *$", text, re.MULTILINE), text
    assert report.chain_worked is False
    assert EnvironmentSmokeReport(episodes=episodes[:2], plans=[mcqa]).chain_worked
