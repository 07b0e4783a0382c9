"""A harness environment end to end in Miles' own rollout step: ``opencode_math``, NeMo-Gym's
``opencode_agent`` running the real ``opencode`` CLI (npm ``opencode-ai``, the version its config
pins, installed by ``serve`` into the cache), one train step per session server version.

Miles' ``InferenceRolloutFn`` -> ``agentic_tool_call.generate`` -> ``miles_nemogym.agent.run`` ->
the agent's ``/run`` with ``_ng_rollout_id`` -> ``opencode run`` in a fresh workspace, its provider
URL the routing model's with the rollout id -> the routing model -> the sample's Miles session
server (v1 or v2, TITO), whose mock SGLang engine answers with the row's scripted Qwen3 text: a
call of OpenCode's ``bash`` tool, which OpenCode runs, then the boxed answer; math_with_judge
grades it. Servers started as ``serve --env opencode_math`` starts them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fault_server import FaultServer
from tests.support.miles_environments import completion, prompt_row
from tests.support.miles_harness import MilesDriver, StepResult
from tests.support.routed_agents import HARNESS, RoutedAgents, running_routed_agents
from tests.support.scripted_chat import Turn, tool
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.integration

_ENV = "opencode_math"
_GOLD = "32"
"""The expected answer of opencode_math's first example row."""
_COMMAND = "python3 -c 'print(2**5)'"
_MATCHER = ("--session-message-matcher", "loose_tool_call")
"""OpenCode replays each tool call's arguments re-serialized (``JSON.stringify``: no spaces), not as
the engine wrote them; Miles' default ``strict`` matcher then sees a new history at the second turn
and rolls the session back, so only the last turn would train. ``loose_tool_call`` compares the
arguments as JSON (docs/environments.md, "Harness environments")."""


def _scripts() -> dict[str, list[Turn]]:
    """Gold: OpenCode's ``bash`` tool computes the answer, then the boxed answer; wrong: one
    boxed wrong answer, no tool."""
    bash = tool("bash", command=_COMMAND, description="Compute 2**5")
    return {
        "gold": [Turn(tool_calls=(bash,)), Turn(content=f"The answer is \\boxed{{{_GOLD}}}.")],
        "wrong": [Turn(content="The answer is \\boxed{33}.")],
    }


@pytest.fixture(scope="module")
def harness_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoutedAgents]:
    with running_routed_agents(HARNESS, tmp_path_factory.mktemp("harness-agents")) as agents:
        yield agents


def _row(agents: RoutedAgents) -> dict[str, Any]:
    row = agents.example_rows(_ENV)[0]
    assert row["expected_answer"] == _GOLD
    return row


@pytest.fixture(scope="module")
def harness_steps(miles_driver: MilesDriver, harness_agents: RoutedAgents) -> Iterator[dict[str, StepResult]]:
    row = _row(harness_agents)
    rows = [prompt_row(_ENV, row, f"{_ENV}_{outcome}") for outcome in _scripts()]
    texts = {f"{_ENV}_{outcome}": [completion(turn) for turn in turns] for outcome, turns in _scripts().items()}

    class Lazy(dict[str, StepResult]):
        def __missing__(self, version: str) -> StepResult:
            swe = FaultServer(result={})  # no SWE row: nothing may reach it
            with serving_in_thread(swe):
                step = miles_driver.step(
                    gym_url=swe.url,
                    rows=rows,
                    n_prompts=len(rows),
                    n_samples=1,
                    session_server=version,
                    env={
                        "NEMO_GYM_ENVS": json.dumps(harness_agents.setting),
                        "NEMO_GYM_RUN_TIMEOUT": "600",
                        "NEMO_GYM_ROLLOUT_SECRET": harness_agents.servers.rollout_secret,
                    },
                    scripts=texts,
                    extra_argv=_MATCHER,
                    response_spans=True,
                    time_limit_s=480,
                ).check()
            assert swe.bodies == []
            self[version] = step
            return step

    yield Lazy()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_opencode_runs_its_tool_and_the_reward_comes_back_through_miles(
    harness_steps: dict[str, StepResult], version: str
) -> None:
    result = harness_steps[version]
    samples = {sample["metadata"]["nemogym_task_id"]: sample for sample in result.samples}
    assert len(samples) == 2
    # One engine call per scripted turn: OpenCode's title call (a second conversation) is off.
    assert result.policy_calls == sum(len(turns) for turns in _scripts().values()), result.policy_calls
    for outcome, turns in _scripts().items():
        sample = samples[f"{_ENV}/{_ENV}_{outcome}"]
        record = sample["metadata"]["nemogym"]
        assert (record["status"], record["mask_sample"], record["environment"]) == ("ok", False, _ENV), record
        assert sample["status"] == "completed"
        assert sample["reward"] == (1.0 if outcome == "gold" else 0.0), (outcome, record)
        assert record["tool_calls"] == sum(len(turn.tool_calls) for turn in turns), record
        # OpenCode ran the command: its output (the answer) is the tool output the policy saw next.
        spans = sample["response_spans"]
        if outcome == "gold":
            between = [text for mask, text in spans if mask == 0]
            assert len(between) == 1 and _GOLD in between[0], spans


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_opencode_episodes_have_no_tito_mismatch_and_train_only_the_policy_turns(
    harness_steps: dict[str, StepResult], version: str
) -> None:
    result = harness_steps[version]
    for sample in result.samples:
        task = sample["metadata"]["nemogym_task_id"]
        assert sample["metadata"]["tito_session_mismatch"] == [], task
        assert len(sample["loss_mask"]) == sample["response_length"] == sample["rollout_log_probs"]
        spans = sample["response_spans"]
        expected = [completion(turn) for turn in _scripts()[task.rsplit("_", 1)[1]]]
        assert [text for mask, text in spans if mask == 1] == expected, task
        assert [mask for mask, _ in spans] == [1, 0] * (len(expected) - 1) + [1], task
    assert result.tracked("rollout/step")[f"rollout/tito_session_mismatch_rate/{version}"] == 0.0
