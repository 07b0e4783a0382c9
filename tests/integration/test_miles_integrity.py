"""Training-run integrity through Miles' real rollout step (``tests/support/miles_harness.py``).

Miles' own ``InferenceRolloutFn``, session server (v1 and v2), router and mock SGLang
engine run the step with this package's hooks, as the launcher wires them; what Miles
would train on is Miles' own ``convert_samples_to_train_data`` with our reward
post-process hook loaded as Miles' RolloutManager loads it. The Gym side is a loopback
server (``tests/support/scripted_gym.py``) whose episodes call the policy through the
session like the real harness, so every fault here is one Miles really sees.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from tests.support.fault_server import FaultServer
from tests.support.miles_harness import MilesDriver, StepResult, grpo
from tests.support.ports import free_port
from tests.support.scripted_gym import ERROR, HOLD, ScriptedGym
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def row_list(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The converted rows in the wheel's order."""
    return list(rows.values())


def episode_of(sample: dict[str, Any]) -> str:
    return str(sample["metadata"]["nemogym"]["episode_id"])


@pytest.mark.parametrize(("session_server", "policy_calls"), [("v1", 1), ("v2", 2)])
def test_a_group_with_one_failed_episode_among_four_trains_as_grpo_over_the_other_three(
    miles_driver: MilesDriver,
    row_list: list[dict[str, Any]],
    sympy_result: dict[str, Any],
    session_server: str,
    policy_calls: int,
) -> None:
    row = row_list[0]
    instance = row["metadata"]["instance_id"]
    gym = ScriptedGym(result=sympy_result, policy_calls=policy_calls, scripts={instance: [1.0, ERROR, 0.0, 0.5]})
    with serving_in_thread(gym):
        result = miles_driver.step(gym_url=gym.url, rows=[row], n_prompts=1, n_samples=4, session_server=session_server)
    result.check()
    assert [call["result"]["keep"] for call in result.hook_calls("dynamic_filter")] == [True]
    samples = result.samples
    train = result.train_data
    assert len(train["rewards"]) == len(samples)
    episodes: dict[str, list[int]] = defaultdict(list)
    for index, sample in enumerate(samples):
        episodes[episode_of(sample)].append(index)
    assert len(episodes) == 4 and len(gym.bodies) == 4
    if session_server == "v2":
        # Each policy call of the stand-in episode starts a new conversation: v2 makes one
        # sample per call, all sharing the episode's rollout_id.
        assert all(len(indices) == policy_calls for indices in episodes.values())
        for indices in episodes.values():
            assert len({train["rollout_ids"][i] for i in indices}) == 1
    masked = [i for i, s in enumerate(samples) if s["metadata"]["nemogym"]["mask_sample"]]
    assert len(masked) == policy_calls  # the one failed episode, every sample of it
    for i in masked:
        assert samples[i]["metadata"]["nemogym"]["failure_kind"] == "agent_run_error"
        assert set(train["loss_masks"][i]) == {0}
        assert train["rewards"][i] == 0.0
    valid_episodes = [indices for indices in episodes.values() if indices[0] not in masked]
    raw = [float(samples[indices[0]]["reward"]) for indices in valid_episodes]
    assert sorted(raw) == [0.0, 0.5, 1.0]
    for indices, expected in zip(valid_episodes, grpo(raw), strict=True):
        for i in indices:
            assert train["rewards"][i] == pytest.approx(expected, abs=1e-5)
            assert 1 in train["loss_masks"][i]
    tracked = result.tracked("rollout/step")
    assert tracked["nemogym/groups_salvaged"] == 1.0 and tracked["nemogym/groups_dropped"] == 0.0
    assert tracked["nemogym/samples_zero_loss"] == float(policy_calls)
    assert tracked["nemogym/episodes"] == 4.0
    assert tracked["nemogym/failure_rate/agent_run_error"] == 0.25


def test_min_valid_zero_drops_the_partly_failed_group_instead(
    miles_driver: MilesDriver, row_list: list[dict[str, Any]], sympy_result: dict[str, Any]
) -> None:
    failing, clean = row_list[0], row_list[1]
    scripts = {failing["metadata"]["instance_id"]: [1.0, ERROR, 0.0, 0.5]}
    gym = ScriptedGym(result=sympy_result, policy_calls=1, scripts=scripts)
    with serving_in_thread(gym):
        result = miles_driver.step(
            gym_url=gym.url, rows=[failing, clean], n_prompts=1, n_samples=4,
            env={"NEMO_GYM_MIN_VALID_PER_GROUP": "0"},
        )  # fmt: skip
    result.check()
    verdicts = [(c["result"]["keep"], c["result"]["reason"]) for c in result.hook_calls("dynamic_filter")]
    assert verdicts[0] == (False, "nemogym_agent_run_error") and verdicts[-1] == (True, None)
    assert {s["metadata"]["instance_id"] for s in result.samples} == {clean["metadata"]["instance_id"]}
    assert result.tracked("rollout/step")["nemogym/groups_dropped"] == 1.0


def test_a_task_whose_episodes_all_fail_before_their_first_policy_call_is_counted_and_its_group_dropped(
    miles_driver: MilesDriver, row_list: list[dict[str, Any]], results: dict[str, dict[str, Any]]
) -> None:
    # The server answers HTTP 500 at once for one task: no model call, so Miles returns
    # those samples ABORTED without our record, and their group is dropped.
    broken, clean = row_list[0], row_list[1]
    gym = FaultServer.with_fault(results, broken["metadata"]["instance_id"], "500")
    with serving_in_thread(gym):
        result = miles_driver.step(gym_url=gym.url, rows=[broken, clean], n_prompts=1, n_samples=2)
    result.check()
    assert result.hook_calls("dynamic_filter")[0]["result"]["reason"] == "group_has_aborted"
    tracked = result.tracked("rollout/step")
    assert tracked["nemogym/episodes"] == 4.0
    assert tracked["nemogym/failure_rate/agent_run_error"] == 0.5
    assert tracked["nemogym/failure_rate"] == 0.5
    assert tracked["nemogym/groups_dropped"] == 1.0


def test_over_sampled_episodes_aborted_at_step_end_are_cancelled_not_failures(
    miles_driver: MilesDriver, row_list: list[dict[str, Any]], sympy_result: dict[str, Any]
) -> None:
    fast, slow = row_list[0], row_list[1]
    gym = ScriptedGym(result=sympy_result, policy_calls=1, scripts={slow["metadata"]["instance_id"]: [HOLD]})
    with serving_in_thread(gym):
        result = miles_driver.step(
            gym_url=gym.url, rows=[fast, slow], n_prompts=1, n_samples=2,
            extra_argv=["--over-sampling-batch-size", "2"],
        )  # fmt: skip
        disconnects = gym.disconnects
    result.check()
    assert {s["metadata"]["instance_id"] for s in result.samples} == {fast["metadata"]["instance_id"]}
    assert disconnects == 2  # Miles' abort reached our abort(): both held /runs were closed
    tracked = result.tracked("rollout/step")
    assert tracked["nemogym/episodes"] == 2.0 and tracked["nemogym/episodes_cancelled"] == 2.0
    assert "nemogym/failure_rate/cancelled" not in tracked and tracked["nemogym/failure_rate"] == 0.0


def test_a_server_failing_everything_stops_the_step_after_the_failure_streak(
    miles_driver: MilesDriver, row_list: list[dict[str, Any]], sympy_result: dict[str, Any]
) -> None:
    gym = FaultServer(result=sympy_result, mode="500")
    with serving_in_thread(gym):
        result = miles_driver.step(
            gym_url=gym.url, rows=row_list[:2], n_prompts=2, n_samples=2,
            env={"NEMO_GYM_MAX_FAILURE_STREAK": "6"}, time_limit_s=120,
        )  # fmt: skip
    assert result.finished, "Miles' rollout kept drawing prompts instead of stopping"
    error = result.error or ""
    assert error.startswith("RunStopped: ") and "NEMO_GYM_MAX_FAILURE_STREAK=6" in error
    assert "agent_run_error x" in error
    # Stopped at the first group verdict after the 6th failure: a handful of groups, not an epoch.
    assert 6 <= len(gym.bodies) <= 6 + 4


OUTAGE_S = 20.0
"""The issue's scenario is a 60 s outage; 20 s exercises the same path (the circuit opens
after the retry budget, episodes wait, the probe sees the server return) in a third of
the time on a shared 2-core machine."""


def test_server_down_mid_step_the_step_completes_when_it_returns(
    miles_driver: MilesDriver,
    row_list: list[dict[str, Any]],
    sympy_result: dict[str, Any],
    results: dict[str, dict[str, Any]],
) -> None:
    port = free_port()
    gym = FaultServer(result=sympy_result, results_by_instance=results, policy_calls=1, port=port)
    outcome: dict[str, StepResult] = {}

    def run_step() -> None:
        outcome["step"] = miles_driver.step(
            gym_url=f"http://127.0.0.1:{port}", rows=row_list[:2], n_prompts=2, n_samples=2,
            time_limit_s=300,
        )  # fmt: skip

    step = threading.Thread(target=run_step)
    logged_from = miles_driver.log_size()
    step.start()
    # The outage runs OUTAGE_S from the first try that found the server down (the agent's warning as
    # the circuit opens), not from the step's start: a cold driver or a loaded machine may take
    # longer than OUTAGE_S to start an episode at all.
    tripped = miles_driver.wait_logged(
        f"NeMo-Gym server http://127.0.0.1:{port} cannot be reached", after=logged_from, limit_s=240,
        still=step.is_alive,
    )  # fmt: skip
    assert tripped, f"no episode tried the down server; driver log:\n{miles_driver.log_tail()}"
    time.sleep(OUTAGE_S)  # the sessions are open, the server is down
    assert step.is_alive()
    with serving_in_thread(gym):
        step.join(timeout=300)
    result = outcome["step"].check()
    kinds = [s["metadata"]["nemogym"]["failure_kind"] for s in result.samples]
    assert kinds == [None] * 4
    # Every episode reached the server exactly once: one /run per Miles session.
    sessions = [body["policy_base_url"] for body in gym.bodies]
    assert len(sessions) == 4 and len(set(sessions)) == 4
    # The first episodes' tries found the server down and tripped its circuit; the others found it
    # open and waited without trying; each was sent once it was back (how long each waited depends
    # on when Miles started it, so it is not asserted).
    attempts = [s["metadata"]["nemogym"]["attempts"] for s in result.samples]
    assert max(attempts) == 2 and min(attempts) >= 1, attempts
    tracked = result.tracked("rollout/step")
    assert tracked["nemogym/episodes"] == 4.0 and "nemogym/failure_rate/transport_unreachable" not in tracked
    # The tripped episode waited out the outage (from just after its try; under load that may start
    # a moment after the test saw the warning), charged to this step.
    assert tracked["nemogym/outage_wait_s"] >= OUTAGE_S / 2, tracked["nemogym/outage_wait_s"]


def test_server_down_for_good_stops_the_step_with_one_clear_error(
    miles_driver: MilesDriver, row_list: list[dict[str, Any]]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = miles_driver.step(
        gym_url=url, rows=row_list[:2], n_prompts=2, n_samples=2,
        env={"NEMO_GYM_OUTAGE_TIMEOUT": "8"}, time_limit_s=180,
    )  # fmt: skip
    assert result.finished, "Miles' rollout kept spinning instead of stopping"
    error = result.error or ""
    assert error.startswith("RunStopped: ") and url in error and "NEMO_GYM_OUTAGE_TIMEOUT=8s" in error
    assert "Start the server" in error
    # It stopped after the timeout, not after an epoch of dropped groups.
    assert 8 <= result.elapsed_s < 8 + 60
