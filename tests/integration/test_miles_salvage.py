"""Episodes that fail before their first policy call, through Miles' real rollout step.

Miles' own ``InferenceRolloutFn``, session server, router and mock engine run the step
(``tests/support/miles_harness.py``); Miles' ``convert_samples_to_train_data`` then builds
the train data with our reward post-process hook, and Miles' ``split_train_data_by_dp_raw``
cuts it into the trainer's shards. The Gym answers HTTP 500 before any policy call for one
episode of every group (``tests/support/scripted_gym.py``): Miles finds no model call for
that episode and returns an ABORTED copy of its input sample without the agent's dict.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from tests.support.miles_harness import MilesDriver, grpo
from tests.support.scripted_gym import START_ERROR, ScriptedGym
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("session_server", ["v1", "v2"])
def test_every_group_with_an_episode_failed_before_the_policy_trains_over_its_other_three(
    miles_driver: MilesDriver,
    rows: dict[str, dict[str, Any]],
    results: dict[str, dict[str, Any]],
    session_server: str,
) -> None:
    prompts = list(rows.values())[:2]
    graded = next(r for r in results.values() if r["instance_id"].startswith("sympy"))
    script: list[float | str] = [1.0, START_ERROR, 0.0, 0.5]
    gym = ScriptedGym(
        result=graded, policy_calls=1, scripts={row["metadata"]["instance_id"]: script for row in prompts}
    )
    with serving_in_thread(gym):
        result = miles_driver.step(
            gym_url=gym.url, rows=prompts, n_prompts=2, n_samples=4, session_server=session_server,
            time_limit_s=240,
        ).check()  # fmt: skip

    # Every group of the step was kept: no prompt beyond the two, no episode run twice.
    verdicts = [(c["result"]["keep"], c["result"]["reason"]) for c in result.hook_calls("dynamic_filter")]
    assert verdicts == [(True, None), (True, None)]
    assert len(gym.bodies) == 8
    train = result.train_data
    samples = result.samples
    assert len(samples) == len(train["rewards"]) == len(train["loss_masks"]) == 8
    by_group: dict[int, list[int]] = defaultdict(list)
    for index, sample in enumerate(samples):
        by_group[sample["group_index"]].append(index)
    assert len(by_group) == 2
    for indices in by_group.values():
        failed = [i for i in indices if samples[i]["metadata"]["nemogym"]["mask_sample"]]
        valid = [i for i in indices if i not in failed]
        assert len(failed) == 1 and len(valid) == 3
        (f,) = failed
        record = samples[f]["metadata"]["nemogym"]
        assert (record["failure_kind"], record["http_status"]) == ("agent_run_error", 500)
        # Zero loss, and a shape Miles converts: a one-token response over two tokens.
        assert (samples[f]["status"], samples[f]["remove_sample"]) == ("failed", True)
        assert (train["loss_masks"][f], train["response_lengths"][f], train["total_lengths"][f]) == ([0], 1, 2)
        assert (train["rewards"][f], train["raw_reward"][f]) == (0.0, 0.0)
        # The group trains as GRPO over its three valid episodes.
        raw = [float(train["raw_reward"][i]) for i in valid]
        assert sorted(raw) == [0.0, 0.5, 1.0]
        for i, expected in zip(valid, grpo(raw), strict=True):
            assert train["rewards"][i] == pytest.approx(expected, abs=1e-5)
            assert 1 in train["loss_masks"][i]
    tracked = result.tracked("rollout/step")
    assert tracked["nemogym/episodes"] == 8.0
    assert tracked["nemogym/failure_rate/agent_run_error"] == 0.25
    assert tracked["nemogym/groups_salvaged"] == 2.0 and tracked["nemogym/groups_dropped"] == 0.0
    assert tracked["nemogym/samples_zero_loss"] == 2.0
