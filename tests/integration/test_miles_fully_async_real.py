"""Fully async training (``train_async.py --fully-async``) over the real NeMo-Gym servers.

One run of Miles' own ``FullyAsyncRolloutFn`` (session server v1, router, mock SGLang engine)
with the launcher's hooks and ``--custom-async-data-buffer-path miles_nemogym.buffer.EpisodeBuffer``,
two drains, each one train call as ``train_async.py`` makes once per step
(``tests/support/miles_harness.py``, ``drains=``); what Miles would train on is Miles'
``convert_samples_to_train_data`` with our post-process hook. Each drain mixes:

- a SWE-bench Verified row sent to the real ``mini_swe_agent_2`` server (local sandbox,
  ``gym_server``), which runs the episode against the sample's session and grades it;
- environment rows played in-process by ``miles_nemogym.agent.run`` against the real 0.7.0
  resources servers of ``mcqa`` and ``workplace_assistant`` (``gym_environments``), a gold and a
  wrong script each (``tests/support/miles_environments.py``);
- a blackjack row played by its real ``gymnasium_agent``, whose model calls reach the session
  through this package's routing model (``routed_blackjack``, ``tests/support/routed_agents.py``).

Stand-ins: the policy (Miles' mock SGLang engine, no GPU: each row's scripted Qwen3 text, the
scripted bash-tool policy for SWE rows) and the training step between drains (none).

One group is in flight at a time (``--async-max-concurrent-samples`` = the group size), so groups
finish in the data's order and which drain trains which row is known: a group lost, trained twice
or generated again shows. The worker still runs ahead of the trainer: a drain's first group starts
while the drain before is logged, and the group after the last drain (the first row again) is
generated and never trained. Several groups in flight, faults, staleness limits, the unused-samples
handlers and session server v2: ``test_miles_fully_async.py`` (``/run`` stand-in).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from miles_nemogym.gym.server import GymServer
from miles_nemogym.smoke._policy import Script
from tests.support.gym_envs import GymEnvironments
from tests.support.miles_environments import MAX_STEPS, completion, prompt_row, scripts
from tests.support.miles_harness import MilesDriver, StepResult, grpo
from tests.support.qwen3_tokenizer import qwen_tool_call_text
from tests.support.routed_agents import BLACKJACK_REWARD, RoutedAgents, gymnasium_scripts, routed_blackjack

pytestmark = pytest.mark.integration
__all__ = ["routed_blackjack"]  # a fixture, imported by name for pytest

BUFFER = ["--custom-async-data-buffer-path", "miles_nemogym.buffer.EpisodeBuffer"]
N = 2  # episodes per group
DRAINS = 2
SYMPY, SPHINX = "sympy__sympy-20916", "sphinx-doc__sphinx-8595"
ENVS = ("mcqa", "workplace_assistant")
# The SWE rows' policy: one look-around command, then the submission (2 turns, 2 tool calls).
SWE_TURNS = tuple(qwen_tool_call_text(Script(look_around_turns=1).command_for_turn(t), t) for t in range(2))
GENERATION_PROMPT = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@dataclass(frozen=True)
class Row:
    """One prompt of the run: its task (an environment row's ``<env>/<script>``, a SWE row's
    instance id), its environment, what the policy writes at each turn, its reward (None: blackjack's
    deal decides; SWE rows score 0.0 at the real server: the scripted look-around fixes nothing)."""

    task: str
    env: str
    turns: tuple[str, ...]
    reward: float | None


def _rows(environments: GymEnvironments) -> list[Row]:
    """The rows in the data's order: drain k trains ``rows[k * per_drain:(k + 1) * per_drain]``.
    The first two are cheap: after the last drain the worker begins the first row again, and the
    second only once that finished, so the run ends before it begins a SWE episode no drain trains."""
    played = {env: scripts(env, environments.example_rows(env)[0]) for env in ENVS}
    blackjack = gymnasium_scripts("blackjack")

    def env_row(env: str, outcome: str) -> Row:
        texts = tuple(completion(turn) for turn in played[env][outcome])
        return Row(f"{env}/{env}_{outcome}", env, texts, 1.0 if outcome == "gold" else 0.0)

    def blackjack_row(outcome: str) -> Row:  # "hit" repeats its one text until the hand ends
        return Row(f"blackjack/blackjack_{outcome}", "blackjack", (completion(blackjack[outcome][0]),), None)

    return [
        env_row("mcqa", "gold"),
        env_row("workplace_assistant", "wrong"),
        Row(SYMPY, "swe", SWE_TURNS, 0.0),
        blackjack_row("stand"),
        env_row("workplace_assistant", "gold"),
        Row(SPHINX, "swe", SWE_TURNS, 0.0),
        env_row("mcqa", "wrong"),
        blackjack_row("hit"),
    ]


@dataclass
class FullyAsyncRun:
    rows: list[Row]
    result: StepResult

    @property
    def per_drain(self) -> int:
        return len(self.rows) // DRAINS

    def trained_in(self, k: int) -> list[Row]:
        return self.rows[k * self.per_drain : (k + 1) * self.per_drain]

    def row(self, task: str) -> Row:
        (found,) = [row for row in self.rows if row.task == task]
        return found


@pytest.fixture(scope="module")
def run(
    miles_driver: MilesDriver,
    gym_server: GymServer,
    gym_environments: GymEnvironments,
    routed_blackjack: RoutedAgents,
    rows: dict[str, dict[str, Any]],
) -> Iterator[FullyAsyncRun]:
    played = _rows(gym_environments)
    prompts = []
    for row in played:
        if row.env == "swe":
            prompts.append(rows[row.task])
        else:
            example = (routed_blackjack if row.env == "blackjack" else gym_environments).example_rows(row.env)[0]
            prompts.append(prompt_row(row.env, example, _script(row)))
    setting: dict[str, Any] = {
        env: {"url": gym_environments.resources_url(env), "max_steps": MAX_STEPS.get(env)} for env in ENVS
    }
    setting["blackjack"] = routed_blackjack.setting["blackjack"]
    result = miles_driver.step(
        gym_url=gym_server.url,
        rows=prompts,
        n_prompts=len(played) // DRAINS,
        n_samples=N,
        drains=DRAINS,
        extra_argv=[*BUFFER, "--async-max-concurrent-samples", str(N)],
        env={
            "NEMO_GYM_ENVS": json.dumps(setting),
            "NEMO_GYM_RUN_TIMEOUT": "600",
            "NEMO_GYM_ROLLOUT_SECRET": routed_blackjack.servers.rollout_secret,
        },
        scripts={_script(row): list(row.turns) for row in played if row.env != "swe"},
        response_spans=True,
        drain_limit_s=240,
        time_limit_s=480,
    ).check()
    drains = result.drains
    assert [d.finished and d.error is None for d in drains] == [True] * DRAINS, drains[-1].raw.get("traceback")
    yield FullyAsyncRun(played, result)


def _script(row: Row) -> str:
    return row.task.split("/", 1)[1]


def _task(record: dict[str, Any]) -> str:
    """An episode record's task: a SWE row's instance id, an environment row's task id."""
    return str(record["instance_id"])


def _groups(drain: StepResult) -> dict[str, list[int]]:
    """Each group the drain trained, as its samples' positions (in ``samples`` and ``train_data``), by task."""
    by_index: dict[int, list[int]] = defaultdict(list)
    for position, sample in enumerate(drain.samples):
        by_index[sample["group_index"]].append(position)
    groups: dict[str, list[int]] = {}
    for positions in by_index.values():
        (task,) = {_task(drain.samples[i]["metadata"]["nemogym"]) for i in positions}
        assert task not in groups, f"{task} trained twice in drain {drain.raw['rollout_id']}"
        groups[task] = positions
    return groups


# -- each row trained once, in the drain its place gives it ---------------------------------------


def test_each_drain_trains_its_rows_once_and_every_paid_episode_is_accounted_for(run: FullyAsyncRun) -> None:
    trained: Counter[str] = Counter()
    for k, drain in enumerate(run.result.drains):
        groups = _groups(drain)
        assert sorted(groups) == sorted(row.task for row in run.trained_in(k)), k
        assert [len(positions) for positions in groups.values()] == [N] * run.per_drain
        assert len(drain.train_data["rewards"]) == len(drain.samples)
        trained.update(s["metadata"]["nemogym"]["episode_id"] for s in drain.samples)
    assert len(trained) == len(run.rows) * N and max(trained.values()) == 1  # no episode trained twice
    # Every episode that finished (the agent function returned) was trained once, but those of the
    # group the worker began after the last drain took its groups: the first row again.
    paid = [call["result"]["nemogym"] for call in run.result.hook_calls("agent")]
    assert len({record["episode_id"] for record in paid}) == len(paid)
    assert set(trained) <= {record["episode_id"] for record in paid}  # none trained that never finished
    assert all(record["attempts"] == 1 for record in paid)  # none sent twice
    per_task = Counter(_task(record) for record in paid)
    first = run.rows[0].task
    others = {task: count for task, count in per_task.items() if task != first}
    assert others == {row.task: N for row in run.rows[1:]}
    assert N <= per_task[first] <= 2 * N


def test_rewards_are_the_real_servers_and_the_trainer_gets_them(run: FullyAsyncRun) -> None:
    for drain in run.result.drains:
        train = drain.train_data
        for task, positions in _groups(drain).items():
            row = run.row(task)
            for i in positions:
                sample = drain.samples[i]
                record = sample["metadata"]["nemogym"]
                assert (sample["status"], record["status"], record["mask_sample"]) == ("completed", "ok", False), task
                assert record["environment"] == row.env
                assert sample["reward"] == sample["metadata"]["reward"] == train["raw_reward"][i], task
                if row.reward is not None:
                    assert sample["reward"] == row.reward, (task, record)
                if row.env == "swe":  # graded by the real server: the submitted patch is no fix
                    assert (record["server_reward"], record["resolved"], record["patch_applied"]) == (0.0, False, True)
                if row.env == "blackjack":  # the hand's result, as the agent's last step reported it
                    info = sample["metadata"]["eval_report"]["info"]
                    assert sample["reward"] == BLACKJACK_REWARD[info["result"]], info
                    if task.endswith("_stand"):
                        assert record["turns"] == 1 and info["result"] != "bust", info
                else:
                    assert record["turns"] == len(row.turns), (task, record)
                assert record["tool_calls"] == sum(t.count("<tool_call>") for t in _policy_turns(row, record))
            # GRPO over the group, as Miles normalises it, with our post-process hook.
            raw = [float(train["raw_reward"][i]) for i in positions]
            assert [train["rewards"][i] for i in positions] == pytest.approx(grpo(raw), abs=1e-5), task


def _policy_turns(row: Row, record: dict[str, Any]) -> list[str]:
    """What the policy wrote at each of the episode's turns (a script's last text repeats)."""
    return [row.turns[min(turn, len(row.turns) - 1)] for turn in range(record["turns"])]


def test_only_the_policy_turns_train(run: FullyAsyncRun) -> None:
    for drain in run.result.drains:
        for sample in drain.samples:
            record, spans = sample["metadata"]["nemogym"], sample["response_spans"]
            row = run.row(_task(record))
            assert len(sample["loss_mask"]) == sample["response_length"] == sample["rollout_log_probs"]
            # loss_mask 1 exactly over each policy turn, as the policy wrote it ...
            trained = [text for mask, text in spans if mask == 1]
            assert trained == _policy_turns(row, record), row.task
            assert [mask for mask, _ in spans] == [1, 0] * (len(trained) - 1) + [1], row.task
            # ... and 0 exactly over what came back between them (tool outputs, the game's
            # observation), each ending in the next turn's generation prompt.
            masked = [text for mask, text in spans if mask == 0]
            for turn, text in zip(trained, masked, strict=False):
                assert text.startswith("\n<|im_start|>user\n") and text.endswith(GENERATION_PROMPT), (row.task, text)
                assert text.count("<tool_response>") == turn.count("<tool_call>"), (row.task, text)


def test_the_session_servers_tito_check_sees_no_mismatch(run: FullyAsyncRun) -> None:
    for drain in run.result.drains:
        for sample in drain.samples:
            assert sample["metadata"]["tito_session_mismatch"] == [], sample["metadata"]["nemogym"]["instance_id"]
        assert drain.tracked("rollout/step")["rollout/tito_session_mismatch_rate/v1"] == 0.0


# -- the buffer's metrics and ours agree with what was trained ------------------------------------


def test_each_drains_metrics_describe_the_groups_it_trained(run: FullyAsyncRun) -> None:
    drains = run.result.drains
    logged_episodes = 0.0
    for k, drain in enumerate(drains):
        tracked = drain.tracked("rollout/step")
        assert tracked["rollout/step"] == k
        assert tracked["nemogym/samples"] == len(drain.samples) == run.per_drain * N
        assert (tracked["nemogym/samples_zero_loss"], tracked["nemogym/groups_salvaged"]) == (0.0, 0.0)
        assert tracked["nemogym/groups_dropped"] == tracked["nemogym/buffer/episodes_dropped"] == 0.0
        for name in ("aborted", "filtered", "stale"):
            assert tracked[f"nemogym/buffer/groups_dropped_{name}"] == 0.0, name
        assert tracked["rollout/fully_async/aborted_groups_filtered"] == 0.0
        assert tracked["rollout/fully_async/stale_groups_filtered"] == 0.0
        assert tracked["nemogym/buffer/groups_regenerated"] == 0.0
        # Nothing waited in the buffer when the drain took its last group (one group in flight).
        assert tracked["nemogym/buffer/groups_buffered"] == tracked["rollout/fully_async/queue_size"] == 0.0
        assert tracked["nemogym/buffer/episodes_buffered"] == 0.0
        # Staleness: the drain's weight version minus the oldest its trained group was generated with.
        staleness = [
            k - min(int(v) for i in positions for v in drain.samples[i]["weight_versions"])
            for positions in _groups(drain).values()
        ]
        assert tracked["rollout/fully_async/max_staleness"] == max(staleness)
        assert tracked["rollout/fully_async/avg_staleness"] == pytest.approx(sum(staleness) / len(staleness))
        # Per environment: the mean reward of the episodes this drain trained.
        rewards: dict[str, list[float]] = defaultdict(list)
        for sample in drain.samples:
            rewards[sample["metadata"]["nemogym"]["environment"]].append(sample["reward"])
        assert set(rewards) == {row.env for row in run.trained_in(k)}
        for env, values in rewards.items():
            assert tracked[f"nemogym/{env}/reward_mean"] == pytest.approx(sum(values) / len(values)), env
        logged_episodes += tracked["nemogym/episodes"]
    assert {v for s in drains[0].samples for v in s["weight_versions"]} == {"0"}
    # Paid, whichever step logs it: trained, or finished after the last drain's log (the group after it).
    paid = len(run.result.hook_calls("agent"))
    trained = sum(len(d.samples) for d in drains)
    assert trained <= logged_episodes <= paid <= trained + N
