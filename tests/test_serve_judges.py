"""``serve --env`` reads each shipped config before anything starts: the datasets it drops, the
judge endpoint it wires in, and what it refuses by name with the reason (from the wheel)."""

from __future__ import annotations

import base64
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.gym._judge_gate import JudgeGate
from miles_nemogym.gym.composition import (
    JUDGE_INSTANCE,
    JUDGE_KEY_ENV,
    Judge,
    config_needs,
    judged_instances,
    overrides,
    refusal,
    served,
    shipped_config,
)
from miles_nemogym.gym.environments import plan, refusals
from miles_nemogym.gym.venv import child_environment
from tests.support.judge_model import JudgeModel
from tests.support.threaded import serving_in_thread

JUDGE = Judge(url="http://judge:8000/v1/", model="judge-model")


def _config(name: str) -> dict[str, Any]:
    [p] = plan([name])
    return shipped_config(p.config)


def _serve(*arguments: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["serve", *arguments])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, " ".join(result.stderr.split())  # rich wraps long lines


def test_the_datasets_serve_never_reads_are_dropped() -> None:
    # spartqa's licence names are not ones nemo-gym's parser accepts: its agent was an "almost-server".
    layer = overrides(_config("spartqa"), None)
    assert layer == {"spartqa_simple_agent": {"responses_api_agents": {"simple_agent": {"datasets": None}}}}


def test_a_config_is_read_with_the_configs_it_pulls_in() -> None:
    # critpt's agent block comes from the agent's own config (config_paths): it routes policy_model.
    agent = _config("critpt")["critpt_agent"]["responses_api_agents"]["critpt_agent"]
    assert agent["model_server"] == {"type": "responses_api_models", "name": "policy_model"}
    assert agent["resources_server"]["name"] == "critpt_resources_server"


@pytest.mark.parametrize("env", ["critpt", "scicode", "terminal_bench_4"])
def test_agents_whose_policy_model_comes_from_their_agent_config_are_not_refused(env: str) -> None:
    assert refusal(env, _config(env), None) is None


def test_a_resources_server_that_reaches_the_policy_itself_is_refused_naming_the_field() -> None:
    # toolsandbox's user simulator is policy_model, called without a rollout id: no session to send it to.
    assert "calls policy_model itself (user_model_server)" in str(refusal("toolsandbox", _config("toolsandbox"), None))
    # speed_bench scrapes the policy's own vLLM /metrics; under serve the policy is a Miles session.
    said = str(refusal("speed_bench", _config("speed_bench"), None))
    assert "reads the policy's own server (vllm_base_url: ${policy_base_url})" in said


def test_a_judge_is_wired_as_one_model_server_of_serves_own() -> None:
    layer = overrides(_config("abstention"), JUDGE)
    ref = layer["abstention"]["resources_servers"]["abstention"]["judge_model_server"]
    assert ref == {"name": JUDGE_INSTANCE}
    model = layer[JUDGE_INSTANCE]["responses_api_models"]["vllm_model"]
    assert (model["base_url"], model["model"]) == ("http://judge:8000/v1", "judge-model")
    # The key is never in the config: the judge's process resolves it from its own environment.
    assert model["api_key"] == f"${{oc.env:{JUDGE_KEY_ENV},EMPTY}}"


def test_a_judge_the_config_defines_with_its_own_endpoint_settings_is_replaced() -> None:
    # over_refusal_detection's judge_model needs ${judge_base_url} etc., which nothing sets.
    config = served(_config("over_refusal_detection"), JUDGE)
    assert "judge_model" not in config
    block = config["over_refusal_detection"]["resources_servers"]["over_refusal_detection"]
    assert block["judge_model_server"] == {"type": "responses_api_models", "name": JUDGE_INSTANCE}


def test_a_judge_that_was_the_policy_itself_goes_to_the_judge_endpoint() -> None:
    # The policy model is the trainer's: a judge call there would grade with the policy.
    config = served(_config("equivalence_llm_judge"), JUDGE)
    block = config["equivalence_llm_judge"]["resources_servers"]["equivalence_llm_judge"]
    assert block["judge_model_server"]["name"] == JUDGE_INSTANCE


def test_a_judge_the_config_switches_off_needs_no_endpoint() -> None:
    assert judged_instances(_config("math_with_judge")) == []  # should_use_judge: false
    assert judged_instances(_config("bbq")) == [("bbq", "bbq", "bbq_judge_model")]


@pytest.mark.parametrize(
    "env",
    ["aalcr", "abstention", "aegis_v4_safety", "bbq", "equivalence_llm_judge", "arena_judge", "simpleqa"],
)
def test_a_judged_environment_without_an_endpoint_is_refused_naming_the_flags(env: str) -> None:
    reason = refusal(env, _config(env), None)
    assert reason is not None and f"environment {env!r} grades with a judge model" in reason
    assert "--judge-url URL --judge-model NAME" in reason and JUDGE_KEY_ENV in reason
    assert refusal(env, _config(env), JUDGE) is None


@pytest.mark.parametrize(
    ("env", "agent"), [("legal_agent_bench", "harbor_agent"), ("finance_sec_search", "finance_agent")]
)
def test_an_agent_that_drops_the_rollout_id_is_refused_by_name(env: str, agent: str) -> None:
    reason = refusal(env, _config(env), JUDGE)
    assert reason is not None and f"environment {env!r}: its agent" in reason and f"({agent})" in reason
    assert "/ng-rollout/<id>" in reason


def test_langgraph_and_an_agent_without_the_policy_model_are_refused() -> None:
    def agent(kind: str, model: str) -> dict[str, Any]:
        block = {"model_server": {"type": "responses_api_models", "name": model}}
        return {"a": {"responses_api_agents": {kind: block}}}

    assert "(langgraph_agent) posts /v1/responses" in str(refusal("x", agent("langgraph_agent", "policy_model"), None))
    said = str(refusal("genrm_compare", _config("genrm_compare"), JUDGE))
    assert "calls model server 'policy_model_reasoning_off', not policy_model" in said
    assert refusal("x", agent("simple_agent", "policy_model"), None) is None


def test_several_refused_environments_are_each_named_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MILES_NEMOGYM_GYM_PYTHON", str(tmp_path / "no-python"))  # nothing could be built
    code, said = _serve("--no-swe", "--env", "bbq", "--env", "mcqa", "--env", "legal_agent_bench", "--env", "simpleqa")
    assert code == 2
    assert "error: --env: environment 'bbq' grades with a judge model" in said
    assert "error: --env: environment 'simpleqa' grades with a judge model" in said
    assert "error: --env: environment 'legal_agent_bench': its agent" in said
    assert "'mcqa'" not in said


def test_judge_flags_come_together_and_the_url_is_checked() -> None:
    assert _serve("--no-swe", "--env", "bbq", "--judge-model", "j") == (
        2,
        "error: --judge-model needs --judge-url too: a judge is an endpoint and a model name",
    )
    code, said = _serve("--no-swe", "--env", "bbq", "--judge-url", "judge:8000", "--judge-model", "j")
    assert code == 2 and "--judge-url: 'judge:8000' is not an http(s) URL" in said


def test_a_dry_run_with_a_judge_says_which_environments_it_grades() -> None:
    code, said = _serve(
        "--no-swe", "--dry-run", "--env", "bbq", "--env", "mcqa", "--judge-url", JUDGE.url, "--judge-model", "jm"
    )
    assert code == 0, said
    assert "judge: bbq graded by jm at http://judge:8000/v1" in said


def test_a_password_in_the_judge_url_is_never_printed() -> None:
    password = "s3cret-judge-pass"
    code, said = _serve(
        "--no-swe", "--dry-run", "--env", "bbq", "--judge-url", f"http://user:{password}@judge:8000/v1",
        "--judge-model", "jm",
    )  # fmt: skip
    assert code == 0, said
    assert "judge: bbq graded by jm at http://user:***@judge:8000/v1" in said and password not in said
    code, said = _serve("--no-swe", "--env", "bbq", "--judge-url", f"ftp://user:{password}@judge", "--judge-model", "j")
    assert code == 2 and "--judge-url: 'ftp://user:***@judge' is not an http(s) URL" in said
    assert password not in said


def test_a_dry_run_names_what_an_environments_servers_lack_and_exits_1() -> None:
    code, said = _serve("--no-swe", "--dry-run", "--env", "critpt", "--env", "swebench")
    assert code == 1, said
    assert "critpt: critpt_resources_server (critpt): the setting artificial_analysis_api_key" in said
    assert "swebench: swebench_resources_server (swebench): a sandbox provider (task containers)" in said


def test_a_dry_run_with_a_judge_does_not_ask_for_the_settings_of_the_judge_it_replaces() -> None:
    arguments = ["--no-swe", "--dry-run", "--env", "over_refusal_detection"]
    code, said = _serve(*arguments, "--judge-url", JUDGE.url, "--judge-model", "jm")
    assert code == 0 and "judge_base_url" not in said, said


def test_a_harness_agents_cli_missing_from_path_is_named() -> None:
    config = _config("example_mcp_weather")
    assert any("the 'claude' command on PATH" in need for need in config_needs(config, {}, which=lambda _: None))
    assert not any("command on PATH" in need for need in config_needs(config, {}, which=lambda name: f"/bin/{name}"))


def test_no_child_inherits_the_judge_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JUDGE_KEY_ENV, "sk-judge-secret-value-123456")
    assert JUDGE_KEY_ENV not in child_environment()
    assert os.environ[JUDGE_KEY_ENV]  # serve's own environment keeps it, for its relay to the judge endpoint


def test_refusals_of_plans_list_each_refused_one() -> None:
    plans = plan(["mcqa", "bbq", "abstention"])
    assert [r.split("'")[1] for r in refusals(plans, None)] == ["bbq", "abstention"]
    assert refusals(plans, JUDGE) == []


def test_the_relay_sends_a_url_password_as_basic_auth_when_there_is_no_key(tmp_path: Path) -> None:
    with serving_in_thread(JudgeModel()) as judge:
        url = judge.url.replace("http://", "http://grader:p%40ss-word-123@")
        gate = JudgeGate(Judge(url=url, model="jm"), None, ["p@ss-word-123"], tmp_path / "relay.log")
        gate.start()
        try:
            assert "@" not in gate.judge.url and gate.judge.url.endswith("/v1")
            body = {"model": "jm", "messages": [{"role": "user", "content": "Gold target: 1\nPredicted answer: 1"}]}
            request = urllib.request.Request(
                f"{gate.judge.url}/chat/completions", data=json.dumps(body).encode(), method="POST"
            )
            request.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(request, timeout=30) as answer:
                assert json.load(answer)["choices"][0]["message"]["content"] == "A"
        finally:
            gate.stop()
    assert judge.authorizations == ["Basic " + base64.b64encode(b"grader:p@ss-word-123").decode()]
