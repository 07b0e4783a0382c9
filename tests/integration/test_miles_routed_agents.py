"""Environments played by their own NeMo-Gym agent server, with the routing model in the path,
in Miles' own rollout step (``tests/support/miles_harness.py``; one train step per session
server version).

Miles' ``InferenceRolloutFn`` -> ``agentic_tool_call.generate`` -> ``miles_nemogym.agent.run``,
which POSTs each row to its environment's agent (``NEMO_GYM_ENVS[env].agent``: the real 0.7.0
``gymnasium_agent`` of blackjack, example_multi_turn_gymnasium and openair_congestion, the real
``tool_simulation_agent`` of swe_pivot, and the real ``simple_agent`` of three environments the
in-process loop is tested on) with ``_ng_rollout_id``; the agent's model calls go to the routing
model (``policy_model``), which sends each to the sample's Miles session server (v1 or v2, TITO),
whose mock SGLang engine answers with the row's scripted Qwen3 text.
Every server is started as ``serve --env NAME --routed`` starts it (``tests/support/routed_agents.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.fault_server import FaultServer
from tests.support.hostile_session import SESSION_PORTS
from tests.support.miles_environments import completion, prompt_row, scripts
from tests.support.miles_harness import MilesDriver, StepResult
from tests.support.policy_sessions import asked_sessions
from tests.support.routed_agents import (
    BLACKJACK_REWARD,
    GYMNASIUM,
    ROUTED_SIMPLE,
    TOOL_SIMULATION,
    RoutedAgents,
    gymnasium_scripts,
    model_base_urls,
    running_routed_agents,
)
from tests.support.scripted_chat import Turn, tool
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.integration


def _played() -> list[tuple[str, str, list[Turn]]]:
    return [(env, outcome, turns) for env in GYMNASIUM for outcome, turns in gymnasium_scripts(env).items()]


# swe_pivot grades the one tool call of a pivot turn against the demonstrated one. Its example rows
# declare no ``tools``; an engine parses ``<tool_call>`` text into tool calls only when the request
# declares tools (SGLang, and so Miles' mock engine), so with those rows every answer is text and
# scores 0.0 (as NeMo-Gym's own example_rollouts.jsonl, from gpt-4.1, do). Rows given the agent's
# tools, as a training set declares them:
_SWE_TOOLS = [
    {
        "type": "function",
        "name": "execute_bash",
        "description": "Run a bash command in the repository.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        "strict": False,
    },
    {
        "type": "function",
        "name": "str_replace_editor",
        "description": "View, create or edit a file.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "path": {"type": "string"}},
            "required": ["command", "path"],
        },
        "strict": False,
    },
]
_SWE_ROW = 1
"""swe_pivot's example_2: the expected action is ``execute_bash`` (a grep)."""


def _tool_simulation_row(agents: RoutedAgents, env: str) -> dict[str, Any]:
    row = agents.example_rows(env)[_SWE_ROW]
    return {**row, "responses_create_params": {**row["responses_create_params"], "tools": _SWE_TOOLS}}


def _tool_simulation_scripts(agents: RoutedAgents, env: str) -> dict[str, list[Turn]]:
    expected = _tool_simulation_row(agents, env)["expected_action"]
    wrong = tool("str_replace_editor", command="view", path="/workspace/proj/foo.py")  # an edit tool, not bash
    gold = (expected["name"], expected["arguments"])
    return {"gold": [Turn(tool_calls=(gold,))], "wrong": [Turn(tool_calls=(wrong,))]}


_OPENAIR_RANGE = [-64.0, 16.0]
"""openair_congestion's episode return is a sum of per-step rewards the wheel bounds nowhere (about
-0.4 a step here, -1 more for a rejected action); ``serve`` prints no range for it, so the test
gives one in its ``NEMO_GYM_ENVS`` entry, as a user must."""


def _returns_played_directly(agents: RoutedAgents, env: str, call: tuple[str, str]) -> tuple[float, int]:
    """(the summed reward, the steps) of ``env``'s row played at its resources server's ``/reset`` and
    ``/step`` with ``call`` at every step, as ``gymnasium_agent`` plays it, without any model."""
    row, total, steps = _row(agents, env), 0.0, 0
    with httpx.Client(base_url=agents.setting[env]["url"], timeout=60) as env_server:
        env_server.post("/reset", json=row).raise_for_status()
        while steps < 16:  # the agent's max_steps in the shipped config
            output = [{"type": "function_call", "call_id": f"c{steps}", "name": call[0], "arguments": call[1]}]
            response = {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": output}
            response |= {"parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
            step = env_server.post("/step", json={**row, "response": response})
            step.raise_for_status()
            total, steps = total + step.json()["reward"], steps + 1
            if step.json()["terminated"] or step.json()["truncated"]:
                break
    return total, steps


def _row(agents: RoutedAgents, env: str) -> dict[str, Any]:
    return _tool_simulation_row(agents, env) if env in TOOL_SIMULATION else agents.example_rows(env)[0]


@pytest.fixture(scope="module")
def routed_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoutedAgents]:
    envs = [*GYMNASIUM, *TOOL_SIMULATION, *ROUTED_SIMPLE]
    with running_routed_agents(envs, tmp_path_factory.mktemp("routed-agents")) as agents:
        yield agents


@pytest.fixture(scope="module")
def routed_steps(miles_driver: MilesDriver, routed_agents: RoutedAgents) -> Iterator[dict[str, StepResult]]:
    every = _every(routed_agents)
    rows = [prompt_row(env, _row(routed_agents, env), f"{env}_{outcome}") for env, outcome, _ in every]
    texts = {f"{env}_{outcome}": [completion(turn) for turn in turns] for env, outcome, turns in every}
    openair = {**routed_agents.setting["openair_congestion"], "reward_range": _OPENAIR_RANGE}
    setting = {**routed_agents.setting, "openair_congestion": openair}

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
                        "NEMO_GYM_ENVS": json.dumps(setting),
                        "NEMO_GYM_RUN_TIMEOUT": "600",
                        "NEMO_GYM_ROLLOUT_SECRET": routed_agents.servers.rollout_secret,
                    },
                    scripts=texts,
                    response_spans=True,
                    time_limit_s=480,
                ).check()
            assert swe.bodies == []
            self[version] = step
            return step

    yield Lazy()


def _every(agents: RoutedAgents) -> list[tuple[str, str, list[Turn]]]:
    """Every row of the step: (environment, outcome, its scripted turns)."""
    simple = [(env, outcome, turns) for env in ROUTED_SIMPLE for outcome, turns in _simple_scripts(agents, env)]
    return _played() + _tool_simulated(agents) + simple


def _tool_simulated(agents: RoutedAgents) -> list[tuple[str, str, list[Turn]]]:
    return [(env, o, turns) for env in TOOL_SIMULATION for o, turns in _tool_simulation_scripts(agents, env).items()]


def _simple_scripts(agents: RoutedAgents, env: str) -> list[tuple[str, list[Turn]]]:
    return list(scripts(env, agents.example_rows(env)[0]).items())


@pytest.fixture(scope="module")
def openair_returns(routed_agents: RoutedAgents) -> dict[str, tuple[float, int]]:
    """Each openair_congestion script's (return, steps), its actions played directly."""
    found = {
        outcome: _returns_played_directly(routed_agents, "openair_congestion", turns[0].tool_calls[0])
        for outcome, turns in gymnasium_scripts("openair_congestion").items()
    }
    assert found["rejected"][0] < found["noop"][0] < 0.0, found  # the guardrail's penalty shows in the return
    return found


def _by_task(result: StepResult) -> dict[str, dict[str, Any]]:
    found = {sample["metadata"]["nemogym_task_id"]: sample for sample in result.samples}
    assert len(found) == len(result.samples)
    return found


def test_serve_prints_the_agent_of_each_routed_environment(routed_agents: RoutedAgents) -> None:
    for env in (*GYMNASIUM, *TOOL_SIMULATION, *ROUTED_SIMPLE):
        entry = routed_agents.setting[env]
        assert set(entry) >= {"url", "agent"} and entry["agent"] != entry["url"], env
    assert routed_agents.setting["blackjack"]["reward_range"] == [-1.0, 1.0]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_gymnasium_agents_rewards_come_back_through_the_routing_model(
    routed_steps: dict[str, StepResult], openair_returns: dict[str, tuple[float, int]], version: str
) -> None:
    samples = _by_task(routed_steps[version])
    for env, outcome, turns in _played():
        sample = samples[f"{env}/{env}_{outcome}"]
        record = sample["metadata"]["nemogym"]
        assert (record["status"], record["mask_sample"], record["environment"]) == ("ok", False, env), record
        assert sample["status"] == "completed"
        if env == "example_multi_turn_gymnasium":
            assert sample["reward"] == (1.0 if outcome == "gold" else 0.0)
            assert record["turns"] == len(turns)
            continue
        if env == "openair_congestion":  # the sum over its steps, as the same actions score played directly
            reward, steps = openair_returns[outcome]
            assert sample["reward"] == pytest.approx(reward, abs=1e-9) and record["turns"] == steps, record
            continue
        # blackjack: the reward is the hand's result (-1 is a valid reward here), as its last step reported it.
        info = sample["metadata"]["eval_report"]["info"]
        assert sample["reward"] == BLACKJACK_REWARD[info["result"]], info
        if outcome == "stand":
            assert record["turns"] == 1 and info["result"] != "bust"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_tool_simulation_agent_grades_the_parsed_tool_call(
    routed_steps: dict[str, StepResult], routed_agents: RoutedAgents, version: str
) -> None:
    samples = _by_task(routed_steps[version])
    for env, outcome, _ in _tool_simulated(routed_agents):
        sample = samples[f"{env}/{env}_{outcome}"]
        record = sample["metadata"]["nemogym"]
        assert (record["status"], record["mask_sample"], record["environment"]) == ("ok", False, env), record
        assert (record["turns"], record["tool_calls"]) == (1, 1), record
        report = sample["metadata"]["eval_report"]
        if outcome == "gold":
            assert sample["reward"] == 1.0 and report["tool_name_match"] is True, report
        else:  # the call was parsed and graded: the wrong tool, not "no function_call in response"
            assert (sample["reward"], report["failure_reason"]) == (0.0, "tool_name_mismatch"), report


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_simple_agent_through_its_own_run_scores_as_the_in_process_loop(
    routed_steps: dict[str, StepResult], routed_agents: RoutedAgents, version: str
) -> None:
    samples = _by_task(routed_steps[version])
    for env in ROUTED_SIMPLE:
        for outcome, turns in _simple_scripts(routed_agents, env):
            sample = samples[f"{env}/{env}_{outcome}"]
            record = sample["metadata"]["nemogym"]
            assert (record["status"], record["environment"]) == ("ok", env), record
            assert sample["reward"] == (1.0 if outcome == "gold" else 0.0), (env, outcome, record)
            assert record["turns"] == len(turns)
            assert record["tool_calls"] == sum(len(turn.tool_calls) for turn in turns)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_routed_episodes_have_no_tito_mismatch_and_train_only_the_policy_turns(
    routed_steps: dict[str, StepResult],
    routed_agents: RoutedAgents,
    openair_returns: dict[str, tuple[float, int]],
    version: str,
) -> None:
    result = routed_steps[version]
    texts = {f"{env}_{outcome}": [completion(t) for t in turns] for env, outcome, turns in _every(routed_agents)}
    for sample in result.samples:
        task = sample["metadata"]["nemogym_task_id"]
        assert sample["metadata"]["tito_session_mismatch"] == [], task
        spans = sample["response_spans"]
        assert len(sample["loss_mask"]) == sample["response_length"] == sample["rollout_log_probs"]
        # Trained: exactly the policy's turns as it wrote them; masked: everything between them
        # (tool outputs, a game's observations, a scripted user's follow-ups).
        trained = [text for mask, text in spans if mask == 1]
        expected = texts[task.split("/", 1)[1]]
        if task == "blackjack/blackjack_hit":  # hits until the hand ends: 1 to 5 turns of the same text
            assert 1 <= len(trained) <= 5 and set(trained) == set(expected), task
        elif task.startswith("openair_congestion/"):  # the same action at each of its steps
            assert trained == expected * openair_returns[task.rsplit("_", 1)[1]][1], task
        else:
            assert trained == expected, task
        assert [mask for mask, _ in spans] == [1, 0] * (len(trained) - 1) + [1], task
    assert result.tracked("rollout/step")[f"rollout/tito_session_mismatch_rate/{version}"] == 0.0


# -- the routing model itself, and the harness path (claude_code, codex, opencode agents) -------------


def test_a_harness_calls_reach_only_the_session_its_rollout_id_names(routed_agents: RoutedAgents) -> None:
    import httpx

    from miles_nemogym.episode.run import policy_base_url
    from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import rollout_id
    from miles_nemogym.smoke._policy import RecordingPolicy

    chat = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    secret = routed_agents.servers.rollout_secret
    with RecordingPolicy(look_around_turns=1, port=_free_session_port()) as session_server:
        s1 = "0123456789abcdef0123456789abcdef"  # a Miles session id: uuid4().hex
        session = session_server.session_url(s1)
        policy = policy_base_url(session, "http://127.0.0.1:1")
        foreign = rollout_id(f"http://10.9.9.9:80/sessions/{s1}/v1", secret)
        base, undecodable, elsewhere = model_base_urls(routed_agents, rollout_id(policy, secret), "not-a-url", foreign)
        assert "/ng-rollout/" in base  # the harness is handed the id in its URL ...
        answer = httpx.post(f"{base}/chat/completions", json=chat, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["role"] == "assistant"
        # ... and the call reached that session, and nothing else.
        assert asked_sessions(session_server) == [s1] and len(session_server.chat_requests(s1)) == 1
        responses = {"input": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(f"{base}/responses", json=responses, timeout=60)
        assert answer.status_code == 200 and answer.json()["object"] == "response", answer.text
        assert len(session_server.chat_requests(s1)) == 2  # Responses converted to chat, as vllm_model does

        model = f"http://127.0.0.1:{routed_agents.servers.ports['policy_model']}"
        # No rollout id, one that names nothing, one for a server not allowed: refused, never a default model.
        refused = {
            "no id": f"{model}/v1/chat/completions",
            "not an encoding": f"{undecodable}/chat/completions",
            "another server": f"{elsewhere}/chat/completions",
        }
        for why, url in refused.items():
            answer = httpx.post(url, json=chat, timeout=60)
            assert answer.status_code == 403, (why, answer.status_code, answer.text)
        assert len(session_server.chat_requests(s1)) == 2


def _free_session_port() -> int:
    """A free port among those the routing model allows (``SESSION_PORTS``)."""
    import socket

    for port in range(SESSION_PORTS[0], SESSION_PORTS[1] + 1):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {SESSION_PORTS}")
