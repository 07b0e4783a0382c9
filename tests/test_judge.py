"""One judge: the same answer document gets the same verdict (valid or masked, failure kind, reward)
whether a SWE ``/run``, an agent row's ``/run`` or a resources server's ``/verify`` sent it; one
"passed" rule for the scan and the episode store, which reads the typed record only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from miles_nemogym.episode.run import classify_agent_http, classify_http
from miles_nemogym.errors import VERIFIER_ERROR
from miles_nemogym.scan._results import Verdict, verdict_of
from miles_nemogym.store import _browser as browser
from miles_nemogym.store import _plots as plots
from miles_nemogym.store.views import load
from tests.support.agent_fixtures import fast_env
from tests.support.environment_episodes import chat, episode
from tests.support.fake_resources import fake_resources
from tests.support.hostile_store import entry, write_step
from tests.support.runtime_settings import UseSettings
from tests.support.scripted_chat import ScriptedChat, Turn

__all__ = ["chat", "fast_env"]  # fixtures used by name
pytestmark = pytest.mark.usefixtures("fast_env")

INSTANCE = "repo__x-1"
Verdict3 = tuple[bool, str | None, float]
"""(masked, failure kind, reward trained on)."""

DOCUMENTS: list[tuple[dict[str, Any], Verdict3]] = [
    # The three: a reward outside the range with a kind the server named keeps the kind.
    ({"reward": 2.0, "failure_kind": "judge_failed", "mask_sample": False}, (True, "judge_failed", 0.0)),
    # A valid answer keeps the server's kind as its status.
    ({"reward": 0.0, "failure_kind": "judge_failed", "mask_sample": False}, (False, "judge_failed", 0.0)),
    # Masked without a kind: the one default.
    ({"reward": 0.5, "mask_sample": True}, (True, VERIFIER_ERROR, 0.0)),
    ({"reward": 1.0, "failure_kind": "judge_failed", "mask_sample": True}, (True, "judge_failed", 0.0)),
    ({"reward": 1.0, "mask_sample": 0}, (True, VERIFIER_ERROR, 0.0)),
    ({"reward": 1.0, "mask_sample": "false"}, (True, VERIFIER_ERROR, 0.0)),
    ({"reward": 1.0, "failure_kind": 5}, (True, VERIFIER_ERROR, 0.0)),
    ({"reward": 1.0, "failure_kind": "not a kind!"}, (True, VERIFIER_ERROR, 0.0)),
    ({"reward": "1"}, (True, VERIFIER_ERROR, 0.0)),
    ({"reward": None}, (True, VERIFIER_ERROR, 0.0)),
    # No reward at all: step 2, whichever server; a masked answer keeps the kind it names.
    ({}, (True, VERIFIER_ERROR, 0.0)),
    ({"mask_sample": True, "failure_kind": "session_lost"}, (True, "session_lost", 0.0)),
    ({"reward": -0.5}, (True, VERIFIER_ERROR, 0.0)),
    ({"reward": 1.0}, (False, None, 1.0)),
    ({"reward": 0.0, "mask_sample": False}, (False, None, 0.0)),
]
IDS = [json.dumps(document) for document, _ in DOCUMENTS]


def swe_answer(document: dict[str, Any]) -> bytes:
    """A graded ``/run`` answer for ``INSTANCE`` with ``document``'s verdict fields: its own fields
    (step 3) in order, so only the shared rule decides."""
    reward = document.get("reward")
    resolved = isinstance(reward, float) and reward >= 1.0
    report = {INSTANCE: {"resolved": resolved, "patch_successfully_applied": True, "tests_status": {}}}
    return json.dumps({"instance_id": INSTANCE, "metadata": {"eval_report": report}, **document}).encode()


def verdict3(masked: bool, kind: str | None, reward: float) -> Verdict3:
    return masked, kind, reward


@pytest.mark.parametrize(("document", "expected"), DOCUMENTS, ids=IDS)
def test_a_swe_run_answer_gets_the_one_verdict(document: dict[str, Any], expected: Verdict3) -> None:
    outcome = classify_http(200, swe_answer(document), instance_id=INSTANCE)
    assert verdict3(outcome.record.mask_sample, outcome.record.failure_kind, outcome.reward) == expected


@pytest.mark.parametrize(("document", "expected"), DOCUMENTS, ids=IDS)
def test_an_agent_run_answer_gets_the_one_verdict(document: dict[str, Any], expected: Verdict3) -> None:
    body = json.dumps({"response": {"output": []}, **document}).encode()
    outcome = classify_agent_http(200, body, reward_range=(0.0, 1.0), range_name="NEMO_GYM_REWARD_RANGE")
    assert verdict3(outcome.record.mask_sample, outcome.record.failure_kind, outcome.reward) == expected


@pytest.mark.parametrize(("document", "expected"), DOCUMENTS, ids=IDS)
async def test_a_verify_answer_gets_the_one_verdict(
    document: dict[str, Any], expected: Verdict3, chat: ScriptedChat, use_settings: UseSettings
) -> None:
    chat.script("judged", Turn(content="B"))
    respond = {"verify": lambda body: web.json_response({**body, **document})}
    async with fake_resources(respond=respond) as fake:
        out = await episode(use_settings, chat, fake.url, "judged")
    assert len(fake.verified) == 1
    record = out["nemogym"]
    assert verdict3(record["mask_sample"], record["failure_kind"], out["reward"]) == expected


def test_the_scan_passes_by_the_one_passed_rule() -> None:
    """A SWE answer scoring 1.0 whose report says unresolved did not pass: ``record.passed`` decides."""
    answer = json.loads(swe_answer({"reward": 1.0}))
    answer["metadata"]["eval_report"][INSTANCE]["resolved"] = False
    outcome = classify_http(200, json.dumps(answer).encode(), instance_id=INSTANCE)
    assert (outcome.record.mask_sample, outcome.reward, outcome.record.resolved) == (False, 1.0, False)
    assert verdict_of(outcome)[0] is Verdict.failed


def test_the_scan_names_a_valid_records_status() -> None:
    outcome = classify_http(200, swe_answer({"reward": 0.0, "failure_kind": "judge_failed"}), instance_id=INSTANCE)
    assert verdict_of(outcome)[:2] == (Verdict.failed, "judge_failed")


@pytest.mark.parametrize("mask", [0, 1, "false", None], ids=repr)
def test_the_store_reads_mask_sample_through_the_typed_record(tmp_path: Path, mask: Any) -> None:
    """A record whose ``mask_sample`` is not a boolean is set aside in every view, as the record
    reader rules: shown set aside, never counted valid, never in a quality plot."""
    write_step(tmp_path, "train", 1, [entry("odd", record={"mask_sample": mask}), entry("fine")])
    odd, fine = load(tmp_path).episodes
    assert (odd.masked, odd.kind, odd.passed) == (True, "masked", False)
    assert (fine.masked, fine.kind, fine.passed) == (False, "resolved", True)
    (row,) = browser.summary_rows([odd, fine])
    assert (row.episodes, row.valid, row.passed, row.failures) == (2, 1, 1, {"masked": 1})
    assert "set aside, not trained on" in browser.episode_parts(odd)[3]
    quality, failures, _ = plots.plots([odd, fine])
    assert (quality.series[0].values, quality.series[1].values) == ((1.0,), (1.0,))  # reward mean, resolve rate
    assert failures.series[0].values == (0.5,)
