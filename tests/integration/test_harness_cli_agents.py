"""A harness environment besides opencode's, end to end through its agent's own ``/run``:
``kilocode_math``, NeMo-Gym's ``kilocode_agent`` running the real ``kilo`` CLI (npm
``@kilocode/cli``, installed by ``serve`` into the cache), servers started as ``serve --env
kilocode_math`` starts them.

The agent's ``/run`` with a signed ``_ng_rollout_id`` -> ``kilo run`` in a fresh workspace, its
provider URL the routing model's with the rollout id -> the routing model -> the sample's session
on a loopback scripted chat server (the stand-in for Miles' session server: its
``/sessions/<id>/v1/chat/completions``), which answers with a call of Kilo's ``bash`` tool, which
Kilo runs, then the boxed answer; math_with_judge grades it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from miles_nemogym.routing_root.responses_api_models.miles_routing_model.rollout_ids import rollout_id
from tests.support.routed_agents import HARNESS_RUN, RoutedAgents, running_routed_agents
from tests.support.scripted_chat import ScriptedChat, Turn, tagged, tool

pytestmark = pytest.mark.integration

_ENV = "kilocode_math"
_GOLD = "32"
"""The expected answer of kilocode_math's first example row."""


@pytest.fixture(scope="module")
def kilo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RoutedAgents, ScriptedChat]]:
    with ScriptedChat() as chat:
        allowed = (f"127.0.0.1:{chat.port}",)
        with running_routed_agents(HARNESS_RUN, tmp_path_factory.mktemp("kilo"), allowed) as agents:
            yield agents, chat


def _run(agents: RoutedAgents, chat: ScriptedChat, script: str) -> dict[str, Any]:
    """One episode of the first example row on a session of its own, answered by ``script``."""
    [row] = agents.example_rows(_ENV)[:1]
    assert row["expected_answer"] == _GOLD
    body = tagged(row, script)
    session = f"{chat.session_url(uuid.uuid4().hex)}/v1"
    body["_ng_rollout_id"] = rollout_id(session, agents.servers.rollout_secret)
    answer = httpx.post(f"{agents.agent_url(_ENV)}/run", json=body, timeout=600)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def test_kilo_runs_its_tool_and_the_gold_scores_one(kilo: tuple[RoutedAgents, ScriptedChat]) -> None:
    agents, chat = kilo
    bash = tool("bash", command="python3 -c 'print(2**5)'", description="Compute 2**5")
    chat.script("gold", Turn(tool_calls=(bash,)), Turn(content=f"The answer is \\boxed{{{_GOLD}}}."))
    result = _run(agents, chat, "gold")
    assert result["reward"] == 1.0, result
    # One call per scripted turn (Kilo's title call, a second conversation, is off), both on the
    # sample's session; Kilo ran the command and sent its output back as the tool's result.
    calls = chat.requests("gold")
    assert len(calls) == 2, [c["messages"][-1] for c in calls]
    [output] = [m for m in calls[1]["messages"] if m["role"] == "tool"]
    assert output["content"].strip() == _GOLD
    kinds = [item["type"] for item in result["response"]["output"]]
    assert kinds == ["function_call", "function_call_output", "message"], kinds


def test_kilo_with_a_wrong_answer_scores_zero(kilo: tuple[RoutedAgents, ScriptedChat]) -> None:
    agents, chat = kilo
    chat.script("wrong", Turn(content="The answer is \\boxed{33}."))
    result = _run(agents, chat, "wrong")
    assert result["reward"] == 0.0, result
    assert len(chat.requests("wrong")) == 1
