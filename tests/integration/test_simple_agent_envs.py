"""This package's ``simple_agent``-style loop against real NeMo-Gym 0.7.0 resources servers.

Per environment: a scripted gold answer scores 1.0 and a wrong one 0.0 through our loop,
and NeMo-Gym's own ``simple_agent`` ``/run`` (calling its ``vllm_model`` server in front of
the same scripted policy) sends ``/verify`` the same fields and gets the same reward. The
servers start once per test session (``envs``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from miles_nemogym import agent
from miles_nemogym.episode import environment
from miles_nemogym.episode.record import Outcome, Task
from miles_nemogym.runtime import current, deliver
from miles_nemogym.settings import EnvironmentServer, Settings
from tests.support.env_scripts import ENVIRONMENTS, scripts
from tests.support.gym_envs import GymEnvironments
from tests.support.scripted_chat import ScriptedChat, Turn, tagged, tool

pytestmark = pytest.mark.integration

ENVS = ENVIRONMENTS


def _row(envs: GymEnvironments, env: str) -> dict[str, Any]:
    return envs.example_rows(env)[0]


def _scripts(envs: GymEnvironments, env: str) -> dict[str, list[Turn]]:
    """A gold and a wrong policy for the environment's first example row."""
    return scripts(env, _row(envs, env))


def _max_steps(env: str) -> int | None:
    # The shipped simple_agent configs: workplace_assistant sets max_steps 6, the others none.
    return 6 if env == "workplace_assistant" else None


async def _ours(
    chat: ScriptedChat, envs: GymEnvironments, env: str, row: dict[str, Any], session: str = "s"
) -> Outcome:
    """Our loop on ``row``, as the agent function delivers it; its ``answer`` holds what /verify
    answered, with the response the loop sent it."""
    settings = Settings.from_env({})
    episode = environment.prepare(
        Task.of(row, env),
        EnvironmentServer(url=envs.resources_url(env), max_steps=_max_steps(env)),
        session_url=chat.session_url(session),
        request_kwargs={"temperature": 1.0, "top_p": 1.0, "max_tokens": 512},
        settings=settings,
    )
    return await deliver(episode, settings, current().circuits, current().in_flight)


def _verified(outcome: Outcome) -> dict[str, Any]:
    """What /verify answered ours, with the response the loop sent it."""
    assert isinstance(outcome.answer, dict) and "reward" in outcome.answer, outcome.record
    return outcome.answer


async def _theirs(envs: GymEnvironments, env: str, row: dict[str, Any]) -> dict[str, Any]:
    """NeMo-Gym's own simple_agent ``/run`` on the same row: its ``/verify`` answer."""
    async with aiohttp.ClientSession() as session, session.post(f"{envs.agent_url(env)}/run", json=row) as response:
        text = await response.text()
        assert response.status == 200, text
        answer: dict[str, Any] = json.loads(text)
        return answer


def _items(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The output items as a verifier reads them: generated ids (``rs_``/``msg_``) dropped, and
    the fields a server's Responses model fills with None (a part's ``logprobs``) left out."""
    keep = ("type", "role", "name", "arguments", "call_id", "output", "content", "summary")

    def plain(value: Any) -> Any:
        if isinstance(value, list):
            return [plain(item) for item in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if v is not None}
        return value

    return [{k: plain(item.get(k)) for k in keep if item.get(k) is not None} for item in response["output"]]


def _environment_fields(answer: dict[str, Any]) -> dict[str, Any]:
    """What /verify decided and every field the environment added (the row's own fields too),
    but wall-clock timings (code_gen's ``unit_tests_time_taken`` and ``metadata["execution time"]``)."""
    skipped = {"response", "responses_create_params", "ng_trajectory", "unit_tests_time_taken"}
    fields = {k: v for k, v in answer.items() if k not in skipped}
    if isinstance(fields.get("metadata"), dict):
        fields["metadata"] = {k: v for k, v in fields["metadata"].items() if k != "execution time"}
    return fields


@pytest.mark.parametrize("env", ENVS)
async def test_gold_scores_one_wrong_scores_zero_and_simple_agent_agrees(
    gym_chat: ScriptedChat, gym_environments: GymEnvironments, env: str
) -> None:
    for outcome, turns in _scripts(gym_environments, env).items():
        name = f"{env}_{outcome}"
        gym_chat.script(name, *turns)
        row = tagged(_row(gym_environments, env), name)
        ours = await _ours(gym_chat, gym_environments, env, row)
        assert not ours.record.mask_sample, ours.record.failure_reason
        verified = _verified(ours)
        assert ours.reward == (1.0 if outcome == "gold" else 0.0), (env, outcome, verified)
        assert ours.record.turns == len(turns) == len(gym_chat.requests(name))  # the last turn called no tool
        assert ours.record.tool_calls == sum(len(t.tool_calls) for t in turns)
        assert ours.tool_time_s is not None and ours.tool_time_s > 0
        if outcome == "think_leak":  # the program passed its test; the leaked <think> alone cost the reward
            assert verified["result"] == [True] and verified["reasoning_format_violation_rate"] == 1.0

        theirs = await _theirs(gym_environments, env, row)
        assert theirs["reward"] == ours.reward, (env, outcome)
        assert _items(theirs["response"]) == _items(verified["response"]), (env, outcome)
        assert _environment_fields(theirs) == _environment_fields(verified), (env, outcome)
        assert theirs["response"]["status"] == verified["response"]["status"]
        reason = "ng_termination_reason"
        assert (theirs["response"]["metadata"] or {}).get(reason) == (verified["response"].get("metadata") or {}).get(
            reason
        )


async def test_sampling_keys_tools_and_history_reach_the_policy(
    gym_chat: ScriptedChat, gym_environments: GymEnvironments
) -> None:
    turns = _scripts(gym_environments, "workplace_assistant")["gold"]
    gym_chat.script("wa_wire", *turns)
    row = tagged(_row(gym_environments, "workplace_assistant"), "wa_wire")
    result = await _ours(gym_chat, gym_environments, "workplace_assistant", row)
    assert result.reward == 1.0, result.record
    first, second = gym_chat.requests("wa_wire")[:2]
    assert (first["temperature"], first["top_p"], first["max_tokens"]) == (1.0, 1.0, 512)
    names = [t["function"]["name"] for t in first["tools"]]
    assert names == [t["name"] for t in row["responses_create_params"]["tools"]]
    assert first["messages"][0]["role"] == "system"
    # The turn goes back exactly as the policy wrote it (<think> kept), then the tool's answer.
    assert second["messages"][-2]["content"] == "<think>Find it first.</think>"
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_wa_wire_0_0"
    # The session cookie reached the tool: an unseeded session answers "Session not initialized".
    assert "Session not initialized" not in tool_message["content"]
    assert json.loads(tool_message["content"])  # the tool's raw JSON answer


async def test_real_tool_errors_and_bad_arguments_are_model_visible(
    gym_chat: ScriptedChat, gym_environments: GymEnvironments
) -> None:
    gym_chat.script(
        "wa_errors",
        Turn(tool_calls=(("email_search_emails", "{not json"), tool("no_such_tool", x=1))),
        Turn(content="Giving up."),
    )
    row = tagged(_row(gym_environments, "workplace_assistant"), "wa_errors")
    result = await _ours(gym_chat, gym_environments, "workplace_assistant", row)
    assert result.reward == 0.0 and not result.record.mask_sample
    ours = [i["output"] for i in _verified(result)["response"]["output"] if i["type"] == "function_call_output"]
    answer = await _theirs(gym_environments, "workplace_assistant", row)
    theirs = [i["output"] for i in answer["response"]["output"] if i["type"] == "function_call_output"]
    # Arguments that are not JSON: the same model-visible error in both loops.
    assert ours[0] == theirs[0] and ours[0].startswith('{"error": "Invalid tool call arguments: JSONDecodeError(')
    # A tool the row does not offer: simple_agent POSTs it (workplace_assistant serves any name and
    # answers its own error); ours calls only the row's tools and tells the model which they are.
    assert "no_such_tool" in theirs[1]
    assert json.loads(ours[1])["error"].startswith("Unknown tool 'no_such_tool': this task offers ")


async def test_max_steps_stops_both_loops_at_the_same_turn(
    gym_chat: ScriptedChat, gym_environments: GymEnvironments
) -> None:
    # workplace_assistant's simple_agent stops after 6 steps; a policy that never stops calling tools.
    gym_chat.script("wa_forever", Turn(tool_calls=(tool("email_search_emails", query="x"),)))
    row = tagged(_row(gym_environments, "workplace_assistant"), "wa_forever")
    ours = await _ours(gym_chat, gym_environments, "workplace_assistant", row)
    theirs = await _theirs(gym_environments, "workplace_assistant", row)
    assert (ours.record.turns, ours.record.tool_calls) == (6, 6)  # every turn called a tool: max_steps stopped it
    assert _items(theirs["response"]) == _items(_verified(ours)["response"])
    assert theirs["reward"] == ours.reward == 0.0


async def test_length_cut_off_is_verified_as_incomplete_like_simple_agent(
    gym_chat: ScriptedChat, gym_environments: GymEnvironments
) -> None:
    # Cut off mid-answer with a tool call: neither loop runs the call; the response is incomplete.
    gym_chat.script("mcqa_cut", Turn(content="<think>Let me", tool_calls=(tool("x"),), finish_reason="length"))
    row = tagged(_row(gym_environments, "mcqa"), "mcqa_cut")
    ours = await _ours(gym_chat, gym_environments, "mcqa", row)
    theirs = await _theirs(gym_environments, "mcqa", row)
    assert ours.record.tool_calls == 0 and not ours.record.mask_sample
    verified = _verified(ours)
    assert verified["response"]["status"] == theirs["response"]["status"] == "incomplete"
    assert verified["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert _items(theirs["response"]) == _items(verified["response"])
    assert theirs["reward"] == ours.reward == 0.0


async def test_concurrent_episodes_keep_their_own_sessions(
    gym_chat: ScriptedChat, gym_environments: GymEnvironments
) -> None:
    """Workplace tools act on the session's own sandbox: an email one episode sends is
    invisible to the others, which each search for it after sending their own."""
    n = 6

    async def one(i: int) -> Outcome:
        name = f"wa_iso_{i}"
        gym_chat.script(
            name,
            Turn(tool_calls=(tool("email_send_email", recipient="x@atlas.com", subject=f"iso-{i}", body="b"),)),
            Turn(tool_calls=(tool("email_search_emails", query="iso-"),)),
            Turn(content="ok"),
        )
        return await _ours(
            gym_chat,
            gym_environments,
            "workplace_assistant",
            tagged(_row(gym_environments, "workplace_assistant"), name),
            str(i),
        )

    results = await asyncio.gather(*(one(i) for i in range(n)))
    for i, result in enumerate(results):
        output = _verified(result)["response"]["output"]
        search = [o["output"] for o in output if o["type"] == "function_call_output"][1]
        assert f"iso-{i}" in search
        assert not any(f"iso-{j}" in search for j in range(n) if j != i), search


async def test_rows_of_every_environment_routed_through_agent_run_score_as_the_loop_does(
    gym_chat: ScriptedChat, gym_environments: GymEnvironments, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Converted rows (the task row + our marks + Miles' bookkeeping keys), all environments
    at once, through ``agent.run`` and ``NEMO_GYM_ENVS``: the real servers accept what is sent
    (no mark reaches them) and grade it as the loop alone does."""
    servers: dict[str, dict[str, Any]] = {}
    for env in ENVS:
        steps = _max_steps(env)
        servers[env] = {"url": gym_environments.resources_url(env), **({"max_steps": steps} if steps else {})}
    monkeypatch.setenv("NEMO_GYM_ENVS", json.dumps(servers))

    async def one(env: str, outcome: str) -> dict[str, Any]:
        name = f"{env}_routed_{outcome}"
        gym_chat.script(name, *_scripts(gym_environments, env)[outcome])
        marks = {"nemogym_env": env, "nemogym_task_id": f"{env}/0", "max_seq_len": 8192, "session_server_id": "s"}
        return await agent.run(
            base_url=gym_chat.session_url(name),
            prompt=[],
            request_kwargs={"temperature": 1.0, "top_p": 1.0, "max_tokens": 512},
            metadata={**tagged(_row(gym_environments, env), name), **marks},
        )

    cases = [(env, outcome) for env in ENVS for outcome in ("gold", "wrong")]
    outs = await asyncio.gather(*(one(env, outcome) for env, outcome in cases))
    for (env, outcome), out in zip(cases, outs, strict=True):
        record = out["nemogym"]
        assert (record["status"], record["environment"], record["instance_id"]) == ("ok", env, f"{env}/0"), record
        assert out["reward"] == (1.0 if outcome == "gold" else 0.0), (env, outcome, out["eval_report"])
        assert out["agent_metrics"]["total_tool_time"] > 0
