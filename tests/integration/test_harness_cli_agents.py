"""Harness environments besides opencode's, end to end through their agent's own ``/run``:
``kilocode_math`` (NeMo-Gym's ``kilocode_agent`` running the real ``kilo`` CLI, npm
``@kilocode/cli``) and ``cline_math`` (``cline_agent``, the real ``cline`` CLI), each installed by
``serve`` into the cache, servers started as ``serve --env NAME`` starts them.

The agent's ``/run`` with a signed ``_ng_rollout_id`` -> the CLI in a fresh workspace, its
provider URL the routing model's with the rollout id -> the routing model -> the sample's session
on a loopback scripted chat server (the stand-in for Miles' session server: its
``/sessions/<id>/v1/chat/completions``), which answers with a call of the CLI's own shell tool
(Kilo's ``bash``, Cline's ``run_commands``), which the CLI runs, then the boxed answer;
math_with_judge grades it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import rollout_id
from tests.support.routed_agents import HARNESS_RUN, RoutedAgents, running_routed_agents
from tests.support.scripted_chat import ScriptedChat, Turn, tagged, tool

pytestmark = pytest.mark.integration

_GOLD = "32"
"""The expected answer of each environment's first example row."""
_COMMAND = "python3 -c 'print(2**5)'"
_SHELL = {
    "kilocode_math": tool("bash", command=_COMMAND, description="Compute 2**5"),
    "cline_math": tool("run_commands", commands=[_COMMAND]),
}
"""Each CLI's shell tool, called in the form its tool schema gives."""


@pytest.fixture(scope="module", params=HARNESS_RUN)
def harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, RoutedAgents, ScriptedChat]]:
    """One environment's servers at a time (both pair the same math_with_judge instance)."""
    env = str(request.param)
    with ScriptedChat() as chat:
        allowed = (f"127.0.0.1:{chat.port}",)
        with running_routed_agents((env,), tmp_path_factory.mktemp(env), allowed) as agents:
            yield env, agents, chat


def _run(agents: RoutedAgents, chat: ScriptedChat, env: str, script: str) -> dict[str, Any]:
    """One episode of ``env``'s first example row on a session of its own, answered by ``script``."""
    [row] = agents.example_rows(env)[:1]
    assert row["expected_answer"] == _GOLD
    body = tagged(row, script)
    session = f"{chat.session_url(uuid.uuid4().hex)}/v1"
    body["_ng_rollout_id"] = rollout_id(session, agents.servers.rollout_secret)
    answer = httpx.post(f"{agents.agent_url(env)}/run", json=body, timeout=600)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def test_the_cli_runs_its_shell_tool_and_the_gold_scores_one(harness: tuple[str, RoutedAgents, ScriptedChat]) -> None:
    env, agents, chat = harness
    script = f"{env}_gold"
    chat.script(script, Turn(tool_calls=(_SHELL[env],)), Turn(content=f"The answer is \\boxed{{{_GOLD}}}."))
    result = _run(agents, chat, env, script)
    assert result["reward"] == 1.0, result
    # One call per scripted turn (no second conversation, such as Kilo's title call), both on the
    # sample's session; the CLI ran the command and sent its output back as the tool's result.
    calls = chat.requests(script)
    assert len(calls) == 2, [c["messages"][-1] for c in calls]
    [output] = [m for m in calls[1]["messages"] if m["role"] == "tool"]
    assert _GOLD in str(output["content"]), output
    kinds = [item["type"] for item in result["response"]["output"]]
    assert kinds == ["function_call", "function_call_output", "message"], kinds


def test_a_wrong_answer_scores_zero(harness: tuple[str, RoutedAgents, ScriptedChat]) -> None:
    env, agents, chat = harness
    script = f"{env}_wrong"
    chat.script(script, Turn(content="The answer is \\boxed{33}."))
    result = _run(agents, chat, env, script)
    assert result["reward"] == 0.0, result
    assert len(chat.requests(script)) == 1
