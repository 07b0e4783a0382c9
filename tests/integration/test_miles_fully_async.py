"""Fully async training (``train_async.py --fully-async``) through Miles' real ``FullyAsyncRolloutFn``.

Miles' own fully async rollout, session server (v1 and v2), router and mock SGLang engine run
with exactly the hooks the launcher wires plus ``--custom-async-data-buffer-path
miles_nemogym.buffer.EpisodeBuffer``; each drain is one train call, as ``train_async.py``
makes once per step (``tests/support/miles_harness.py``, ``drains=``), the background worker
generating in between. What Miles would train on is Miles' ``convert_samples_to_train_data``
with our post-process hook. The Gym side is the loopback ``/run`` stand-in
(``tests/support/scripted_gym.py``), whose episodes call the policy through the session.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.launcher._command import eval_args
from miles_nemogym.launcher._config import LauncherConfig
from tests.support.miles_harness import MilesDriver, StepResult, grpo
from tests.support.ports import free_port
from tests.support.scripted_gym import ERROR, START_ERROR, ScriptedGym
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.integration

BUFFER = ["--custom-async-data-buffer-path", "miles_nemogym.buffer.EpisodeBuffer"]
N = 4  # episodes per group
PROMPTS = 2  # groups per drain


@pytest.fixture(scope="module")
def prompts(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return list(rows.values())[:PROMPTS]


def scripted(sympy_result: dict[str, Any], prompts: list[dict[str, Any]], script: list[float | str]) -> ScriptedGym:
    return ScriptedGym(
        result=sympy_result, policy_calls=1, scripts={row["metadata"]["instance_id"]: script for row in prompts}
    )


def run(
    driver: MilesDriver, gym: ScriptedGym, prompts: list[dict[str, Any]], drains: int, *extra: str, **kwargs: Any
) -> StepResult:
    with serving_in_thread(gym):
        return driver.step(
            gym_url=gym.url, rows=prompts, n_prompts=PROMPTS, n_samples=N, drains=drains,
            extra_argv=[*BUFFER, *extra], time_limit_s=kwargs.pop("time_limit_s", 240), **kwargs,
        )  # fmt: skip


def assert_salvaged_grpo(drain: StepResult, failed_status: str = "failed", *, scripted: bool = True) -> None:
    """Each group of the drain: its valid episodes trained as GRPO over themselves, its failed ones
    with zero loss (status ``failed`` when salvage gave it back, Miles' own when it came with its
    record). ``scripted``: the group played its prompt's script alone, so 3 valid (1.0, 0.5, 0.0)
    and 1 failed; False where two groups of one prompt may be in flight at once and share its
    script (a regenerated prompt beside its next turn in the data)."""
    train, samples = drain.train_data, drain.samples
    assert len(samples) == len(train["rewards"]) == PROMPTS * N
    by_group: dict[int, list[int]] = defaultdict(list)
    for index, sample in enumerate(samples):
        by_group[sample["group_index"]].append(index)
    assert len(by_group) == PROMPTS
    for indices in by_group.values():
        failed = [i for i in indices if samples[i]["metadata"]["nemogym"]["mask_sample"]]
        valid = [i for i in indices if i not in failed]
        if scripted:
            assert len(failed) == 1, [samples[i]["metadata"]["nemogym"] for i in indices]
        assert valid, [samples[i]["metadata"]["nemogym"] for i in indices]
        for f in failed:
            assert samples[f]["status"] == failed_status
            assert (set(train["loss_masks"][f]), train["rewards"][f]) == ({0}, 0.0)
        raw = [float(train["raw_reward"][i]) for i in valid]
        if scripted:
            assert sorted(raw) == [0.0, 0.5, 1.0]
        for i, expected in zip(valid, grpo(raw), strict=True):
            assert train["rewards"][i] == pytest.approx(expected, abs=1e-5)


# -- nothing paid is lost under the data buffer ----------------------------------------------------


@pytest.mark.parametrize("session_server", ["v1", "v2"])
def test_an_episode_failed_before_its_first_policy_call_is_salvaged_in_every_drain(
    miles_driver: MilesDriver,
    prompts: list[dict[str, Any]],
    sympy_result: dict[str, Any],
    session_server: str,
) -> None:
    gym = scripted(sympy_result, prompts, [1.0, START_ERROR, 0.0, 0.5])
    result = run(miles_driver, gym, prompts, 2, session_server=session_server).check()
    drains = result.drains
    assert [d.finished and d.error is None for d in drains] == [True, True], drains[-1].raw.get("traceback")
    trained: Counter[str] = Counter()
    for drain in drains:
        assert_salvaged_grpo(drain)
        trained.update(s["metadata"]["nemogym"]["episode_id"] for s in drain.samples)
        tracked = drain.tracked("rollout/step")
        assert (tracked["nemogym/groups_salvaged"], tracked["nemogym/groups_dropped"]) == (2.0, 0.0)
        assert tracked["nemogym/samples_zero_loss"] == 2.0
        assert tracked["nemogym/buffer/groups_dropped_aborted"] == 0.0
        assert tracked["rollout/fully_async/aborted_groups_filtered"] == 0.0
    assert max(trained.values()) == 1  # no episode trained twice


@pytest.mark.parametrize("session_server", ["v1", "v2"])
def test_an_episode_masked_after_the_policy_answered_is_salvaged(
    miles_driver: MilesDriver, prompts: list[dict[str, Any]], sympy_result: dict[str, Any], session_server: str
) -> None:
    gym = scripted(sympy_result, prompts, [1.0, ERROR, 0.0, 0.5])
    result = run(miles_driver, gym, prompts, 2, session_server=session_server).check()
    for drain in result.drains:
        assert drain.finished and drain.error is None, drain.raw.get("traceback")
        assert_salvaged_grpo(drain, failed_status="completed")


def test_miles_default_buffer_drops_every_such_group_which_is_why_ours_exists(
    miles_driver: MilesDriver, prompts: list[dict[str, Any]], sympy_result: dict[str, Any]
) -> None:
    gym = scripted(sympy_result, prompts, [1.0, START_ERROR, 0.0, 0.5])
    with serving_in_thread(gym):
        result = miles_driver.step(
            gym_url=gym.url, rows=prompts, n_prompts=PROMPTS, n_samples=N, drains=1, drain_limit_s=15,
            time_limit_s=120,
        ).check()  # fmt: skip
    (drain,) = result.drains
    assert not drain.finished  # nothing completes: DefaultDataBuffer.put drops each group unfiltered
    assert len(gym.bodies) > 2 * PROMPTS * N  # paid, and none trained
    assert result.hook_calls("dynamic_filter") == []  # the run-stop check never ran


# -- the run stops as in sync mode -------------------------------------------------------------


@pytest.mark.parametrize("failure", [START_ERROR, ERROR])
def test_a_server_that_only_fails_stops_the_run_after_the_failure_streak(
    miles_driver: MilesDriver, prompts: list[dict[str, Any]], sympy_result: dict[str, Any], failure: str
) -> None:
    gym = scripted(sympy_result, prompts, [failure])
    result = run(miles_driver, gym, prompts, 2, env={"NEMO_GYM_MAX_FAILURE_STREAK": "8"}, time_limit_s=120).check()
    drain = result.drains[0]
    error = drain.error or ""
    assert error.startswith("RunStopped: ") and "NEMO_GYM_MAX_FAILURE_STREAK=8" in error, drain.raw
    assert "agent_run_error x" in error
    # Stopped at the first group put after the 8th failure: the groups in flight, not an epoch.
    assert 8 <= len(gym.bodies) <= 8 + 2 * PROMPTS * N


def test_an_outage_past_the_timeout_stops_the_run_with_one_clear_error(
    miles_driver: MilesDriver, prompts: list[dict[str, Any]]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = miles_driver.step(
        gym_url=url, rows=prompts, n_prompts=PROMPTS, n_samples=N, drains=2, extra_argv=BUFFER,
        env={"NEMO_GYM_OUTAGE_TIMEOUT": "8"}, drain_limit_s=90, time_limit_s=180,
    ).check()  # fmt: skip
    drain = result.drains[0]
    error = drain.error or ""
    assert error.startswith("RunStopped: ") and url in error and "NEMO_GYM_OUTAGE_TIMEOUT=8s" in error, drain.raw
    assert "Start the server" in error
    assert 8 <= drain.elapsed_s < 8 + 60  # the sync bound (test_miles_integrity.py)


# -- the unused-samples handlers, staleness ---------------------------------------------------------


@pytest.mark.parametrize("handler", ["drop", "retry"])
def test_stale_groups_are_dropped_counted_and_regenerated_only_under_retry(
    miles_driver: MilesDriver, rows: dict[str, dict[str, Any]], sympy_result: dict[str, Any], handler: str
) -> None:
    # Twice the groups a drain takes in flight from the start, none answered before all their
    # episodes called the policy: all at weight version 0, before drain 0 could end. Drain 0
    # trains two of them; the other two are consumed at version 1 or later, stale at staleness 0.
    # One prompt per group of that wave: each instance's script goes to one group's episodes.
    wave = 2 * PROMPTS
    prompts = list(rows.values())[:wave]
    gym = scripted(sympy_result, prompts, [1.0, START_ERROR, 0.0, 0.5])
    gym.first_wave = wave * N
    extra = ["--max-weight-staleness", "0", "--async-unused-samples-handler", handler]
    extra += ["--async-max-concurrent-samples", str(wave * N)]
    result = run(miles_driver, gym, prompts, 3, *extra).check()
    drains = result.drains
    assert all(d.finished and d.error is None for d in drains), drains[-1].raw.get("traceback")
    stale = regenerated = 0.0
    for k, drain in enumerate(drains):
        assert_salvaged_grpo(drain, scripted=k == 0)  # later, a prompt's groups may overlap
        # Trained at staleness 0: every sample generated with the weights of its own step.
        versions = {v for sample in drain.samples for v in sample["weight_versions"]}
        assert versions == {str(k)}, versions
        tracked = drain.tracked("rollout/step")
        assert tracked["nemogym/buffer/groups_dropped_stale"] == tracked["rollout/fully_async/stale_groups_filtered"]
        stale += tracked["nemogym/buffer/groups_dropped_stale"]
        regenerated += tracked["nemogym/buffer/groups_regenerated"]
    assert stale >= wave - PROMPTS  # the first wave's groups drain 0 left (later ones may go stale too)
    assert regenerated == (stale if handler == "retry" else 0.0)
    # Every /run is a new episode: a regenerated prompt is a new Miles sample, never a resend.
    sessions = [body["policy_base_url"] for body in gym.bodies]
    assert len(set(sessions)) == len(sessions)


# -- metrics, eval per drain -------------------------------------------------------------------------


@pytest.mark.parametrize("session_server", ["v1", "v2"])
def test_each_drain_logs_the_groups_it_trained_and_paid_episodes_add_up(
    miles_driver: MilesDriver, prompts: list[dict[str, Any]], sympy_result: dict[str, Any], session_server: str
) -> None:
    # Each policy call a new conversation: under v2 an episode that made them comes back as two samples.
    gym = ScriptedGym(
        result=sympy_result, policy_calls=2,
        scripts={row["metadata"]["instance_id"]: [1.0, START_ERROR, 0.0, 0.5] for row in prompts},
    )  # fmt: skip
    result = run(miles_driver, gym, prompts, 3, session_server=session_server).check()
    drains = result.drains
    assert all(d.finished and d.error is None for d in drains), drains[-1].raw.get("traceback")
    paid = trained = dropped = 0.0
    seen: Counter[str] = Counter()
    for k, drain in enumerate(drains):
        tracked = drain.tracked("rollout/step")
        # What this step trained, not what was judged since the last one.
        assert tracked["nemogym/episodes_trained"] == PROMPTS * N and tracked["nemogym/groups_salvaged"] == PROMPTS
        # v2: each episode that called the policy is two samples, the one failed before it one.
        per_group = N if session_server == "v1" else 2 * (N - 1) + 1
        assert tracked["nemogym/samples"] == PROMPTS * per_group
        if k:
            assert "rollout/fully_async/avg_staleness" in tracked  # Miles' own, next to ours
        paid += tracked["nemogym/episodes"]
        trained += tracked["nemogym/episodes_trained"]
        dropped += tracked["nemogym/buffer/episodes_dropped"]
        seen.update({s["metadata"]["nemogym"]["episode_id"] for s in drain.samples})
    buffered = drains[-1].tracked("rollout/step")["nemogym/buffer/episodes_buffered"]
    assert max(seen.values()) == 1  # nothing trained twice
    # Paid = trained + dropped + still buffered + finished in a group not yet complete (at most
    # the groups in flight: --rollout-batch-size of them); nothing paid that the server did not see.
    assert trained + dropped + buffered <= paid <= len(gym.bodies)
    assert paid - (trained + dropped + buffered) <= PROMPTS * N


def test_a_shared_engine_eval_between_drains_logs_pass_at_k_at_its_step(
    miles_driver: MilesDriver, prompts: list[dict[str, Any]], results: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    resolved = results["scikit-learn__scikit-learn-14141"]  # every episode resolves: pass@k is 1
    holdout = tmp_path / "holdout.jsonl"
    holdout.write_text("".join(json.dumps(row) + "\n" for row in prompts))
    config = LauncherConfig(eval_data=holdout, eval_name="swe", eval_samples_per_prompt=N, eval_interval=1)
    gym = scripted(resolved, prompts, [1.0, 0.0])
    result = run(miles_driver, gym, prompts, 2, *eval_args(config), eval_after=[0]).check()
    first, second = result.drains
    assert first.error is None and second.finished and second.error is None, second.raw.get("traceback")
    assert len(first.raw["eval"]["swe"]) == PROMPTS * N
    evaluated = first.tracked("eval/step")
    assert evaluated["eval/step"] == first.tracked("rollout/step")["rollout/step"]
    assert evaluated["nemogym-eval/swe/episodes"] == PROMPTS * N
    assert evaluated["nemogym-eval/swe/pass@4"] == 1.0
    assert second.tracked("eval/step") == {}


# -- weight updates ----------------------------------------------------------------------------------


def test_an_episode_running_across_a_weight_update_carries_both_versions_and_trains_once(
    miles_driver: MilesDriver, prompts: list[dict[str, Any]], sympy_result: dict[str, Any]
) -> None:
    # Two policy calls 1.5 s apart; the engine reports version k from drain k on (a weight
    # update between drains, no abort: fully async pauses inside the engine, docs/upstream.md).
    # Session server v2 makes one sample per call, each with the version it was generated with.
    gym = ScriptedGym(
        result=sympy_result, policy_calls=2, between_calls_s=1.5,
        scripts={row["metadata"]["instance_id"]: [1.0, 0.0] for row in prompts},
    )  # fmt: skip
    result = run(miles_driver, gym, prompts, 2, session_server="v2", train_s=0.5).check()
    drains = result.drains
    assert all(d.finished and d.error is None for d in drains), drains[-1].raw.get("traceback")
    per_drain = []
    for drain in drains:
        versions: dict[str, set[str]] = defaultdict(set)
        for sample in drain.samples:
            versions[sample["metadata"]["nemogym"]["episode_id"]].update(sample["weight_versions"])
        per_drain.append(versions)
    assert all(v == {"0"} for v in per_drain[0].values())
    # Started before the update, finished after: its samples carry both versions; trained once.
    assert {"0", "1"} in per_drain[1].values()
    assert not set(per_drain[0]) & set(per_drain[1])
    assert drains[1].tracked("rollout/step")["rollout/fully_async/max_staleness"] == 1.0
    assert all(s["metadata"]["nemogym"]["mask_sample"] is False for d in drains for s in d.samples)


# -- the episode store -------------------------------------------------------------------------------


def test_the_store_files_each_episode_under_the_step_that_trained_it_or_as_not_trained(
    miles_driver: MilesDriver, prompts: list[dict[str, Any]], sympy_result: dict[str, Any], tmp_path: Path
) -> None:
    from miles_nemogym.store import _reader as reader

    good, bad = (row["metadata"]["instance_id"] for row in prompts)
    # Every group of ``bad`` has no valid episode: the buffer drops it (filtered) and trains only ``good``'s.
    # Eight groups in flight: more finish before drain 0's log than drain 0 trains. No graded
    # answer before a ninth group starts: a group of ``bad`` is dropped before drain 0 can end.
    in_flight = 4 * PROMPTS * N
    gym = ScriptedGym(
        result=sympy_result, policy_calls=1, scripts={good: [1.0, 0.0, 0.5, 1.0], bad: [ERROR]},
        graded_after=in_flight + 1,
    )  # fmt: skip
    store_dir = tmp_path / "episodes"
    wide = ["--async-max-concurrent-samples", str(in_flight)]
    result = run(miles_driver, gym, prompts, 2, *wide, env={"NEMO_GYM_EPISODE_DIR": str(store_dir)}).check()
    drains = result.drains
    assert all(d.finished and d.error is None for d in drains), drains[-1].raw.get("traceback")
    stored = reader.load(store_dir)
    assert stored.problems == []
    # Where each episode's line was sealed: the first drain after it finished.
    sealed = {
        json.loads(line)["episode_id"]: int(path.name.split("-")[1])
        for path in (store_dir / "train").glob("step-*.heads")
        for line in path.read_text().splitlines()
    }
    late = 0
    for k, drain in enumerate(drains):
        trained = {s["metadata"]["nemogym"]["episode_id"] for s in drain.samples}
        assert len(trained) == PROMPTS * N
        listed = {e.episode_id for e in stored.episodes if e.step == k and e.not_trained is None}
        assert listed == trained  # under step k: exactly what step k trained
        late += sum(sealed[i] < k for i in trained)
    assert late > 0  # some episode finished during drain 0 and trained at drain 1 (filed there)
    # The rest were in flight or buffered at the last drain: no step trained them yet.
    dropped = [e for e in stored.episodes if e.not_trained not in (None, reader.UNFILED)]
    tracked = sum(d.tracked("rollout/step")["nemogym/buffer/episodes_dropped"] for d in drains)
    assert dropped and len(dropped) == tracked
    assert {e.instance_id for e in dropped} == {bad}
    # The reason is the filter's, as counted in rollout/dynamic_filter/drop_<reason>.
    counted = {key for d in drains for key in d.tracked("rollout/step") if key.startswith("rollout/dynamic_filter/")}
    assert {f"rollout/dynamic_filter/drop_{e.not_trained}" for e in dropped} <= counted, counted
