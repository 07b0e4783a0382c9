"""NeMo-Gym resources-server environments mixed with SWE rows in Miles' own rollout step.

One train step per session server version (``tests/support/miles_harness.py``): Miles'
``InferenceRolloutFn`` -> ``agentic_tool_call.generate`` -> ``miles_nemogym.agent.run``,
which drives each environment row's ``simple_agent``-style episode against the sample's
session URL and the real 0.7.0 resources server (``tests/support/gym_envs.py``), and sends
each SWE row to a ``/run`` server (``tests/support/fault_server.py``, real result shapes).
The session server (v1 or v2, TITO) forwards every model call to Miles' mock SGLang engine,
which answers with each row's scripted Qwen3 text (``tests/support/miles_environments.py``)
and parses its ``<tool_call>`` blocks with SGLang's ``qwen25`` parser. Per environment, a gold
and a wrong script; one sample each (GRPO groups of one keep the step short).
Then one eval step (v1, the launcher's eval wiring) over two environments' rows, k samples
each: ``nemogym-eval/<set>/<env>/pass@1`` and ``pass@k`` as worked out by hand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.episode.record import TASK_ID_KEY
from miles_nemogym.launcher._command import eval_args
from miles_nemogym.launcher._config import LauncherConfig
from tests.support.fault_server import FaultServer
from tests.support.gym_envs import GymEnvironments
from tests.support.miles_environments import ENVIRONMENTS, MAX_STEPS, completion, prompt_row, scripts
from tests.support.miles_harness import MilesDriver, StepResult
from tests.support.scripted_chat import Turn
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.integration

SKLEARN, SYMPY = "scikit-learn__scikit-learn-14141", "sympy__sympy-20916"
SWE_REWARDS = {SKLEARN: 1.0, SYMPY: 0.0}
# The tokens between two model turns: the tool messages as Qwen3's template renders them,
# then the next generation prompt (thinking off).
_TOOL_ROUND = re.compile(
    r"\n<\|im_start\|>user((?:\n<tool_response>\n.*?\n</tool_response>)+)<\|im_end\|>\n"
    r"<\|im_start\|>assistant\n<think>\n\n</think>\n\n",
    re.DOTALL,
)


class Script:
    """One environment row's scripted episode in the step."""

    def __init__(self, env: str, outcome: str, turns: list[Turn]) -> None:
        self.env, self.outcome, self.turns = env, outcome, turns
        self.name = f"{env}_{outcome}"


def _scripts(servers: GymEnvironments) -> list[Script]:
    return [
        Script(env, outcome, turns)
        for env in ENVIRONMENTS
        for outcome, turns in scripts(env, servers.example_rows(env)[0]).items()
    ]


@pytest.fixture(scope="module")
def mixed_steps(
    miles_driver: MilesDriver,
    gym_environments: GymEnvironments,
    rows: dict[str, dict[str, Any]],
    results: dict[str, dict[str, Any]],
) -> Iterator[dict[str, StepResult]]:
    """One train step per session server version: every environment's gold and wrong row
    and two SWE rows (one resolved), one sample each."""
    played = _scripts(gym_environments)
    env_rows = [prompt_row(s.env, gym_environments.example_rows(s.env)[0], s.name) for s in played]
    setting = {
        env: {"url": gym_environments.resources_url(env), "max_steps": MAX_STEPS.get(env)} for env in ENVIRONMENTS
    }
    texts = {s.name: [completion(turn) for turn in s.turns] for s in played}

    class Lazy(dict[str, StepResult]):
        def __missing__(self, version: str) -> StepResult:
            swe = FaultServer(result=results[SKLEARN], results_by_instance=results, policy_calls=1)
            with serving_in_thread(swe):
                step = miles_driver.step(
                    gym_url=swe.url,
                    rows=[*env_rows, rows[SKLEARN], rows[SYMPY]],
                    n_prompts=len(env_rows) + 2,
                    n_samples=1,
                    session_server=version,
                    env={"NEMO_GYM_ENVS": json.dumps(setting), "NEMO_GYM_RUN_TIMEOUT": "600"},
                    scripts=texts,
                    response_spans=True,
                    time_limit_s=420,
                ).check()
            assert sorted(body["instance_id"] for body in swe.bodies) == sorted(SWE_REWARDS)  # each once
            self[version] = step
            return step

    yield Lazy()


def _by_task(result: StepResult) -> dict[str, dict[str, Any]]:
    """Each sample by its environment task id (``<env>/<script>``) or SWE instance id."""
    found: dict[str, dict[str, Any]] = {}
    for sample in result.samples:
        metadata = sample["metadata"]
        key = metadata.get("nemogym_task_id") or metadata["instance_id"]
        assert key not in found, f"{key} came back twice"
        found[key] = sample
    return found


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_gold_scores_one_and_wrong_scores_zero_in_every_environment(
    mixed_steps: dict[str, StepResult], gym_environments: GymEnvironments, version: str
) -> None:
    samples = _by_task(mixed_steps[version])
    train = mixed_steps[version].train_data
    for script in _scripts(gym_environments):
        sample = samples[f"{script.env}/{script.name}"]
        record = sample["metadata"]["nemogym"]
        assert (record["status"], record["mask_sample"], record["environment"]) == ("ok", False, script.env)
        expected = 1.0 if script.outcome == "gold" else 0.0
        assert sample["reward"] == expected, (script.name, record)
        assert sample["status"] == "completed"
        assert record["turns"] == len(script.turns)
        assert record["tool_calls"] == sum(len(turn.tool_calls) for turn in script.turns)
    # The trainer gets the same rewards.
    assert train["raw_reward"] == [s["reward"] for s in mixed_steps[version].samples]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_only_the_policy_turns_train_tool_outputs_are_loss_masked(
    mixed_steps: dict[str, StepResult], gym_environments: GymEnvironments, version: str
) -> None:
    samples = _by_task(mixed_steps[version])
    for script in _scripts(gym_environments):
        sample = samples[f"{script.env}/{script.name}"]
        spans = sample["response_spans"]
        assert len(sample["loss_mask"]) == sample["response_length"] == sample["rollout_log_probs"]
        # loss_mask 1 exactly over each model turn, as the policy wrote it ...
        assert [text for mask, text in spans if mask == 1] == [completion(turn) for turn in script.turns]
        # ... and 0 exactly over the tool outputs between them: one <tool_response> per call.
        masked = [text for mask, text in spans if mask == 0]
        rounds = [turn for turn in script.turns if turn.tool_calls]
        assert len(masked) == len(rounds), script.name
        for text, turn in zip(masked, rounds, strict=True):
            found = _TOOL_ROUND.fullmatch(text)
            assert found is not None, (script.name, text[:200])
            assert found.group(1).count("<tool_response>") == len(turn.tool_calls)
        assert [mask for mask, _ in spans] == [1, 0] * len(rounds) + [1]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_session_servers_tito_check_sees_no_mismatch(mixed_steps: dict[str, StepResult], version: str) -> None:
    result = mixed_steps[version]
    # Per sample (the session server's own comparison of its tokens with the chat re-rendered) ...
    for sample in result.samples:
        assert sample["metadata"]["tito_session_mismatch"] == [], sample["metadata"].get("nemogym_task_id")
    # ... and the rate Miles logs over the step.
    tracked = result.tracked("rollout/step")
    assert tracked[f"rollout/tito_session_mismatch_rate/{version}"] == 0.0


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_one_step_mixes_environments_with_swe_rows_and_logs_per_environment_metrics(
    mixed_steps: dict[str, StepResult], gym_environments: GymEnvironments, version: str
) -> None:
    result = mixed_steps[version]
    samples = _by_task(result)
    for instance, reward in SWE_REWARDS.items():
        record = samples[instance]["metadata"]["nemogym"]
        assert (samples[instance]["reward"], record["status"], record["environment"]) == (reward, "ok", "swe")
    episodes = 2 * len(ENVIRONMENTS) + len(SWE_REWARDS)
    assert len(result.samples) == episodes
    tracked = result.tracked("rollout/step")
    assert tracked["nemogym/episodes"] == float(episodes) and tracked["nemogym/failure_rate"] == 0.0
    # Per environment, next to the totals: one gold and one wrong episode each.
    played = _scripts(gym_environments)
    for env in ENVIRONMENTS:
        mine = [s for s in played if s.env == env]
        assert tracked[f"nemogym/{env}/episodes"] == tracked[f"nemogym/{env}/episodes_valid"] == 2.0, env
        assert tracked[f"nemogym/{env}/reward_mean"] == 0.5, env
        assert tracked[f"nemogym/{env}/turns_mean"] == sum(len(s.turns) for s in mine) / 2, env
        calls = sum(len(turn.tool_calls) for s in mine for turn in s.turns)
        assert tracked[f"nemogym/{env}/tool_calls_mean"] == calls / 2, env
    assert tracked["nemogym/swe/episodes"] == 2.0 and tracked["nemogym/swe/reward_mean"] == 0.5
    # Each environment episode's time in seed, tools and verify is its non-generation time.
    for sample in result.samples:
        if sample["metadata"].get("nemogym_env"):
            assert sample["metadata"]["agent_metrics"]["total_tool_time"] > 0


# The eval step: k episodes of each row; a task's rows share its task id, so a task played by a
# gold and a wrong row has 2k episodes, half of them passing (the engine answers a prompt's k
# samples alike: the rows are how its samples differ).
EVAL_K = 2
EVAL_TASKS: dict[str, dict[str, tuple[str, ...]]] = {
    "mcqa": {"mixed": ("gold", "wrong")},
    "xlam_fc": {"mixed": ("gold", "wrong"), "missed": ("wrong",)},
}
# Worked by hand: "mixed" passes 2 of 4 episodes (pass@1 1/2, pass@2 = 1 - C(2,2)/C(4,2) = 5/6),
# "missed" none of 2 (0, 0); an environment's rates are its tasks' mean.
EVAL_EXPECTED = {
    "mcqa": {"episodes": 4.0, "episodes_valid": 4.0, "pass@1": 1 / 2, "pass@2": 5 / 6, "reward_mean": 1 / 2},
    "xlam_fc": {"episodes": 6.0, "episodes_valid": 6.0, "pass@1": 1 / 4, "pass@2": 5 / 12, "reward_mean": 1 / 3},
}


def test_eval_step_logs_pass_at_1_and_k_per_environment(
    miles_driver: MilesDriver,
    gym_environments: GymEnvironments,
    results: dict[str, dict[str, Any]],
    tmp_path: Path,
) -> None:
    # Miles' eval step with the launcher's eval wiring over environment rows only.
    held_out: list[dict[str, Any]] = []
    texts: dict[str, list[str]] = {}
    for env, tasks in EVAL_TASKS.items():
        example = gym_environments.example_rows(env)[0]
        played = scripts(env, example)
        for task, outcomes in tasks.items():
            for outcome in outcomes:
                name = f"{env}_{task}_{outcome}"
                row = prompt_row(env, example, name)
                row["metadata"][TASK_ID_KEY] = f"{env}/{task}"
                held_out.append(row)
                texts[name] = [completion(turn) for turn in played[outcome]]
    data = tmp_path / "held_out.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in held_out))
    flags = eval_args(LauncherConfig(eval_data=data, eval_name="envs", eval_samples_per_prompt=EVAL_K, eval_interval=1))
    setting = {env: {"url": gym_environments.resources_url(env)} for env in EVAL_TASKS}
    swe = FaultServer(result=results[SKLEARN])
    with serving_in_thread(swe):
        result = miles_driver.step(
            gym_url=swe.url,
            data_file=data,
            n_samples=EVAL_K,
            mode="eval",
            env={"NEMO_GYM_ENVS": json.dumps(setting), "NEMO_GYM_RUN_TIMEOUT": "600"},
            extra_argv=flags,
            scripts=texts,
            rollout_id=4,
            time_limit_s=420,
        ).check()
    assert swe.bodies == []  # no SWE row in the set

    samples = result.eval["envs"]["samples"]
    assert len(samples) == EVAL_K * len(held_out)
    assert {s["metadata"]["nemogym"]["status"] for s in samples} == {"ok"}
    tracked = result.tracked("eval/step")
    assert tracked["eval/step"] == 4
    prefix = "nemogym-eval/envs/"
    for env, expected in EVAL_EXPECTED.items():
        found = {key: tracked.get(f"{prefix}{env}/{key}") for key in expected}
        assert found == pytest.approx(expected), env
    assert f"{prefix}swe/episodes" not in tracked
    # The set's totals: three tasks, two of them "mixed".
    assert tracked[prefix + "episodes"] == 10.0 and tracked[prefix + "instances"] == 3.0
    assert tracked[prefix + "pass@1"] == pytest.approx(1 / 3)
    assert tracked[prefix + "pass@2"] == pytest.approx(5 / 9)
