"""Miles' own rollout step (pinned commit, CPU) with this package's hooks.

Each test runs a real Miles train or eval rollout step through the harness in
``tests/support/miles_harness.py``: Miles' ``InferenceRolloutFn`` ->
``agentic_tool_call.generate`` -> ``miles_nemogym.agent.run`` -> a NeMo-Gym ``/run``
server -> Miles' session server (v1 or v2, TITO) -> Miles' router and mock SGLang engine
with the scripted tool-call policy; then Miles' rollout logging and
``convert_samples_to_train_data``, as ``miles/ray/rollout/rollout_manager.py`` does.

The Gym side is the real ``mini_swe_agent_2`` server (local sandbox) for the normal
path, and ``tests/support/fault_server.py`` (real result shapes; it calls the policy as an
episode does) for exact rewards and faults.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from miles_nemogym.gym.server import GymServer
from tests.support.fault_server import FaultServer
from tests.support.miles_harness import MilesDriver, StepResult
from tests.support.results import partially_passing
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.integration

REAL_ROWS = ("sympy__sympy-20916", "sphinx-doc__sphinx-8595")
SYMPY, SKLEARN, PYLINT = "sympy__sympy-20916", "scikit-learn__scikit-learn-14141", "pylint-dev__pylint-4551"
SPHINX = "sphinx-doc__sphinx-8595"
# The first group fails; Miles draws over_sampling_batch_size (2) more prompts, so four
# rows keep the faulted instance from coming round again in the same step.
FAULT_ROWS = (SYMPY, SKLEARN, PYLINT, SPHINX)
FAST_ENV = {"NEMO_GYM_RUN_TIMEOUT": "600"}


@pytest.fixture(scope="module")
def real_train_steps(
    miles_driver: MilesDriver, gym_server: GymServer, rows: dict[str, dict[str, Any]]
) -> Iterator[dict[str, StepResult]]:
    """One train step per session server version over the real Gym server (2 prompts x 2)."""

    class Lazy(dict[str, StepResult]):
        def __missing__(self, version: str) -> StepResult:
            self[version] = miles_driver.step(
                gym_url=gym_server.url,
                rows=[rows[iid] for iid in REAL_ROWS],
                session_server=version,
                env={"NEMO_GYM_POLICY_API_KEY": "sk-miles-e2e"},
            ).check()
            return self[version]

    yield Lazy()


def _instances(result: StepResult) -> list[set[str]]:
    return [{s["metadata"]["instance_id"] for s in group} for group in result.groups]


def _by_instance(result: StepResult) -> dict[str, list[float]]:
    rewards: dict[str, list[float]] = {}
    for sample in result.samples:
        rewards.setdefault(sample["metadata"]["instance_id"], []).append(sample["reward"])
    return rewards


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_train_step_over_the_real_gym_server(real_train_steps: dict[str, StepResult], version: str) -> None:
    result = real_train_steps[version]

    assert [len(group) for group in result.groups] == [2, 2]
    assert sorted(_instances(result), key=str) == [{iid} for iid in sorted(REAL_ROWS)]
    for sample in result.samples:
        record = sample["metadata"]["nemogym"]
        assert sample["status"] == "completed"
        assert record["status"] == "ok" and record["mask_sample"] is False and record["attempts"] == 1
        assert sample["tokens"] > sample["response_length"] > 0
        assert sample["rollout_log_probs"] == sample["response_length"] == len(sample["loss_mask"])
        # The policy's turns train, the tool output between them does not.
        assert 0 in sample["loss_mask"] and sample["loss_mask"][0] == 1 and sample["loss_mask"][-1] == 1
        assert sample["reward"] == sample["metadata"]["reward"]
        assert "policy_api_key" not in str(sample["metadata"]) and "sk-miles-e2e" not in str(sample["metadata"])
        # One look-around command, then the submission: two model turns in each episode.
        assert (record["turns"], record["tool_calls"]) == (2, 2)
    # Two model calls per episode, no episode replaced: every call is one of the two turns.
    assert result.policy_calls == 8 and sorted(result.raw["policy_turns"]) == [0, 0, 0, 0, 1, 1, 1, 1]

    # Miles called our filter once per group and our log function once, with what it kept.
    assert [call["result"]["keep"] for call in result.hook_calls("dynamic_filter")] == [True, True]
    assert [(c["n_samples"], c["result"]) for c in result.hook_calls("rollout_log")] == [(4, False)]
    assert len(result.hook_calls("agent")) == 4
    # Miles ends every train rollout by aborting what is left, and calls agent.abort then.
    assert len(result.hook_calls("abort")) == 1
    # v1 scores in the reward hook; v2 takes the agent's reward and never calls the hook.
    scored = sum(call["n_samples"] for call in result.hook_calls("reward"))
    assert scored == (4 if version == "v1" else 0)

    tracked = result.tracked("rollout/step")
    assert tracked["nemogym/episodes"] == 4.0 and tracked["nemogym/samples"] == 4.0
    assert tracked["nemogym/failure_rate"] == 0.0
    assert tracked["nemogym/resolve_rate"] == sum(s["reward"] for s in result.samples) / 4
    # Miles' own rollout logging ran after ours (log_rollout returns False), to the same tracking.
    assert tracked["rollout/truncated_ratio"] == 0.0
    # The session server's TITO check saw no token mismatch over the real episodes.
    assert tracked[f"rollout/tito_session_mismatch_rate/{version}"] == 0.0


def test_train_data_as_the_trainer_sees_it(real_train_steps: dict[str, StepResult]) -> None:
    for version in ("v1", "v2"):
        result = real_train_steps[version]
        train = result.train_data
        assert train["raw_reward"] == [s["reward"] for s in result.samples]
        assert train["loss_masks"] == [s["loss_mask"] for s in result.samples]
        assert train["response_lengths"] == [s["response_length"] for s in result.samples]
        assert train["truncated"] == [0, 0, 0, 0]
        # GRPO: each reward minus its group's mean (both samples of a group score alike here).
        assert train["rewards"] == [0.0, 0.0, 0.0, 0.0]


def test_v1_and_v2_give_the_same_rewards_over_the_real_server(real_train_steps: dict[str, StepResult]) -> None:
    assert (
        _by_instance(real_train_steps["v1"])
        == _by_instance(real_train_steps["v2"])
        == {
            SYMPY: [0.0, 0.0],
            "sphinx-doc__sphinx-8595": [0.0, 0.0],
        }
    )


def test_eval_step_goes_through_the_same_hooks(
    miles_driver: MilesDriver, gym_server: GymServer, rows: dict[str, dict[str, Any]]
) -> None:
    result = miles_driver.step(
        gym_url=gym_server.url, rows=[rows[iid] for iid in REAL_ROWS], n_samples=1, mode="eval"
    ).check()

    swe = result.eval["swe"]
    assert [s["metadata"]["instance_id"] for s in swe["samples"]] == list(REAL_ROWS)
    for sample in swe["samples"]:
        assert sample["status"] == "completed" and sample["metadata"]["nemogym"]["status"] == "ok"
    assert swe["rewards"] == [s["metadata"]["reward"] for s in swe["samples"]]
    assert sum(call["n_samples"] for call in result.hook_calls("reward")) == 2
    assert len(result.hook_calls("agent")) == 2
    tracked = result.tracked("eval/step")
    assert tracked["eval/swe"] == sum(swe["rewards"]) / 2
    assert tracked["eval/swe-none_reward_ratio"] == 0.0


@pytest.mark.parametrize("mode", ["partial", "binary"])
def test_v1_and_v2_give_the_same_final_rewards_in_each_reward_mode(
    miles_driver: MilesDriver, rows: dict[str, dict[str, Any]], results: dict[str, dict[str, Any]], mode: str
) -> None:
    answers = {**results, PYLINT: partially_passing(results[PYLINT], 4)}  # 4 of 10 FAIL_TO_PASS pass
    expected = {SKLEARN: [1.0, 1.0], PYLINT: [0.4, 0.4] if mode == "partial" else [0.0, 0.0]}
    server = FaultServer(result=results[SKLEARN], results_by_instance=answers, policy_calls=1)
    with serving_in_thread(server):
        steps = {
            version: miles_driver.step(
                gym_url=server.url,
                rows=[rows[SKLEARN], rows[PYLINT]],
                session_server=version,
                env={**FAST_ENV, "NEMO_GYM_REWARD_MODE": mode},
            ).check()
            for version in ("v1", "v2")
        }
    for version, result in steps.items():
        assert _by_instance(result) == expected, version
        assert result.train_data["raw_reward"] == [s["reward"] for s in result.samples]
    assert len(server.bodies) == 8  # 2 steps x 4 episodes, none run twice


def test_a_group_whose_episodes_all_crash_is_dropped_and_replaced(
    miles_driver: MilesDriver, rows: dict[str, dict[str, Any]], results: dict[str, dict[str, Any]]
) -> None:
    server = FaultServer.with_fault(results, SYMPY, "error_metadata")
    with serving_in_thread(server):
        result = miles_driver.step(gym_url=server.url, rows=[rows[iid] for iid in FAULT_ROWS], env=FAST_ENV).check()

    # Miles drew more prompts for the dropped group; the kept samples are all valid.
    kept = _instances(result)
    assert len(kept) == 2 and {SYMPY} not in kept and {SKLEARN} in kept
    assert all(s["metadata"]["nemogym"]["mask_sample"] is False for s in result.samples)
    filtered = [(c["result"]["keep"], c["result"]["reason"]) for c in result.hook_calls("dynamic_filter")]
    assert [f for f in filtered if not f[0]] == [(False, "nemogym_agent_run_error")]
    assert result.metrics["rollout/dynamic_filter/drop_nemogym_agent_run_error"] == 1
    # Miles logs the drop; our log function only sees the kept samples, but it reports the
    # episodes from the agent's ledger, so the dropped group's failures are counted.
    tracked = result.tracked("rollout/step")
    assert tracked["rollout/dynamic_filter/drop_nemogym_agent_run_error"] == 1
    episodes = tracked["nemogym/episodes"]
    assert episodes + tracked["nemogym/episodes_cancelled"] == len(server.bodies)
    assert tracked["nemogym/failure_rate/agent_run_error"] == 2 / episodes == tracked["nemogym/failure_rate"]
    assert tracked["nemogym/groups_dropped"] == 1.0
    masked = [c["result"] for c in result.hook_calls("agent") if c["result"]["nemogym"]["instance_id"] == SYMPY]
    assert [(m["reward"], m["nemogym"]["mask_sample"]) for m in masked] == [(0.0, True), (0.0, True)]
    assert sorted(result.train_data["raw_reward"]) == [0.0, 0.0, 1.0, 1.0]
    assert [body["instance_id"] for body in server.bodies].count(SYMPY) == 2  # never run twice


def test_a_group_whose_episodes_all_fail_before_their_first_policy_call_comes_back_aborted_and_is_dropped(
    miles_driver: MilesDriver, rows: dict[str, dict[str, Any]], results: dict[str, dict[str, Any]]
) -> None:
    server = FaultServer.with_fault(results, SYMPY, "500")
    with serving_in_thread(server):
        result = miles_driver.step(gym_url=server.url, rows=[rows[iid] for iid in FAULT_ROWS], env=FAST_ENV).check()

    # Our agent returned a masked record, but with no model call recorded Miles returns
    # the input sample ABORTED without it; the group filter drops that group visibly.
    failed = [
        c["result"]["nemogym"] for c in result.hook_calls("agent") if c["result"]["nemogym"]["instance_id"] == SYMPY
    ]
    assert [(r["failure_kind"], r["mask_sample"], r["attempts"]) for r in failed] == [("agent_run_error", True, 1)] * 2
    filtered = [(c["result"]["keep"], c["result"]["reason"]) for c in result.hook_calls("dynamic_filter")]
    assert [f for f in filtered if not f[0]] == [(False, "group_has_aborted")]
    assert result.metrics["rollout/dynamic_filter/drop_group_has_aborted"] == 1
    kept = _instances(result)
    assert len(kept) == 2 and {SYMPY} not in kept and {SKLEARN} in kept
    assert all(s["status"] == "completed" and s["metadata"]["nemogym"]["status"] == "ok" for s in result.samples)
    assert [body["instance_id"] for body in server.bodies].count(SYMPY) == 2  # never run twice


def test_how_miles_calls_the_agent_reaches_the_gym_request(
    miles_driver: MilesDriver, rows: dict[str, dict[str, Any]], results: dict[str, dict[str, Any]]
) -> None:
    """Miles' sampling flags arrive in the /run request; its bookkeeping keys do not."""
    server = FaultServer(result=results[SKLEARN], policy_calls=1)
    sampling = ["--rollout-temperature", "0.7", "--rollout-top-p", "0.9", "--rollout-top-k", "20"]
    with serving_in_thread(server):
        result = miles_driver.step(
            gym_url=server.url,
            rows=[rows[SKLEARN]],
            n_prompts=1,
            env={**FAST_ENV, "NEMO_GYM_POLICY_API_KEY": "sk-miles-convention"},
            extra_argv=[*sampling, "--max-seq-len", "8192"],
        ).check()

    assert len(server.bodies) == 2
    for body in server.bodies:
        assert not {"max_seq_len", "session_server_id", "session_server_instance_id"} & set(body)
        rcp = body["responses_create_params"]
        assert (rcp["temperature"], rcp["top_p"], rcp["max_output_tokens"]) == (0.7, 0.9, 1024)
        assert json.loads(rcp["metadata"]["extra_body"])["top_k"] == 20
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/sessions/[0-9a-f]+/v1", body["policy_base_url"])
        assert body["policy_api_key"] == "sk-miles-convention"
    # Miles adds its bookkeeping to the metadata it passes (max_seq_len, session_server_id).
    for call in result.hook_calls("agent"):
        assert {"max_seq_len", "session_server_id", "instance_id"} <= set(call["metadata_keys"])
    assert all(s["metadata"]["nemogym"]["status"] == "ok" for s in result.samples)


def test_a_step_that_overruns_its_time_limit_reports_not_finished_and_the_next_step_runs(
    miles_driver: MilesDriver, rows: dict[str, dict[str, Any]], results: dict[str, dict[str, Any]]
) -> None:
    """The harness never hangs a test: an overrunning step is cut and the driver restarted.

    (Last in this file: the restart costs Miles' import time once more.)
    """
    holding = FaultServer(result=results[SKLEARN], hold_s=300)
    with serving_in_thread(holding):
        stuck = miles_driver.step(gym_url=holding.url, rows=[rows[SKLEARN]], n_prompts=1, env=FAST_ENV, time_limit_s=45)
    assert (stuck.finished, stuck.raw) == (False, {})
    assert 45 <= stuck.elapsed_s < 60

    server = FaultServer(result=results[SKLEARN], policy_calls=1)
    with serving_in_thread(server):
        result = miles_driver.step(gym_url=server.url, rows=[rows[SKLEARN]], n_prompts=1, env=FAST_ENV).check()
    assert [s["reward"] for s in result.samples] == [1.0, 1.0]
