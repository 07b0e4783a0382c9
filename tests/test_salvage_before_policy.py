"""Episodes that fail before their first policy call are salvaged like any other failed episode.

The agent function runs against a real loopback ``/run`` server; each sample is then what
Miles' ``agentic_tool_call.generate`` returns for it: with a model call, a sample with tokens
and the agent's dict merged in; without one, a deep copy of the input sample marked ABORTED,
without the dict. The group then goes through the filter as Miles calls it. The same path
through Miles' own rollout step is in ``tests/integration/test_miles_salvage.py``.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from miles_nemogym import agent, groups, metrics
from miles_nemogym.episode.record import eval_overrides
from miles_nemogym.runtime import HeldEpisodes, current
from tests.support.agent_fixtures import TOKENS, call, episode, fast_env, input_sample, server
from tests.support.eventually import eventually
from tests.support.fault_server import FaultServer
from tests.support.samples import Status

__all__ = ["fast_env", "server"]  # fixtures used by name
pytestmark = pytest.mark.usefixtures("fast_env")


class Args:
    """The Miles arguments the filter reads, with the post-process hook wired as the launcher does."""

    n_samples_per_prompt = 4
    custom_reward_post_process_path = groups.POST_PROCESS_PATH


async def test_a_group_whose_failed_episode_never_reached_the_policy_trains_over_the_other_three(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    modes = ["ok", "500", "ok", "ok"]
    group = [await episode(server, input_sample(sympy_row, i), mode) for i, mode in enumerate(modes)]

    out = groups.check_episode_group(Args(), group)
    assert (out.keep, out.reason) == (True, None)
    failed = group[1]
    record = failed.metadata["nemogym"]
    assert (record["mask_sample"], record["failure_kind"], record["http_status"]) == (True, "agent_run_error", 500)
    # Convertible by Miles, and never trained: two tokens of a sibling, a one-token
    # response with a zero loss mask, status FAILED, reward 0.
    assert (failed.status, failed.remove_sample, failed.reward) == (Status.FAILED, True, 0.0)
    assert (failed.tokens, failed.response_length, failed.loss_mask) == (TOKENS[:2], 1, [0])
    assert failed.rollout_log_probs == [0.0]
    assert failed.metadata["instance_id"] == sympy_row["instance_id"]  # the task row is kept
    assert all(s.status is Status.COMPLETED and not s.remove_sample for s in group[::2])

    m = metrics.rollout_metrics(group, current().ledger.drain())
    assert m["nemogym/episodes"] == 4.0 and m["nemogym/failure_rate/agent_run_error"] == 0.25
    assert (m["nemogym/groups_salvaged"], m["nemogym/groups_dropped"]) == (1.0, 0.0)
    assert m["nemogym/samples_zero_loss"] == 1.0


async def test_miles_over_sampling_abort_still_drops_its_group(server: FaultServer, sympy_row: dict[str, Any]) -> None:
    # Group 0 finished, one episode failed before the policy: kept. Group 1 was still running
    # when Miles had enough groups: one episode had failed before the policy, one was aborted.
    early = [await episode(server, input_sample(sympy_row, i), m) for i, m in enumerate(["ok", "500"] * 2)]
    assert groups.check_episode_group(Args(), early).keep is True
    modes = ["ok", "ok", "500"]
    late = [await episode(server, input_sample(sympy_row, 4 + i, group=1), m) for i, m in enumerate(modes)]
    server.mode, server.hold_s = "ok", 30.0
    running = asyncio.create_task(call({**sympy_row, "session_server_id": "127.0.0.1:39999"}))
    await eventually(lambda: server.in_flight, "the request reached the server")
    await agent.abort(None)  # Miles' end-of-step abort
    assert (await asyncio.wait_for(running, 5))["nemogym"]["failure_kind"] == "cancelled"
    aborted = copy.deepcopy(input_sample(sympy_row, 7, group=1))
    aborted.status = Status.ABORTED

    # Miles does not filter group 1 after its abort; were it filtered, it would be dropped as
    # today: a cancelled episode is never given back, and the abort forgot what was held.
    out = groups.check_episode_group(Args(), [*late, aborted])
    assert (out.keep, out.reason) == (False, "group_has_aborted")
    assert [s.status for s in [*late[2:], aborted]] == [Status.ABORTED] * 2


async def test_each_failed_episode_is_given_back_once_and_only_to_its_own_task(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    other = {**sympy_row, "instance_id": "astropy__astropy-12907"}
    # A failure after the policy call: its sample came back with its record.
    late = [await episode(server, input_sample(sympy_row, i), m) for i, m in enumerate(["ok", "error_metadata"] * 2)]
    early = [await episode(server, input_sample(sympy_row, 4 + i, 1), m) for i, m in enumerate(["ok", "500"] * 2)]
    # An eval episode failing before the policy is never held: eval samples skip the filter.
    await episode(server, input_sample({**sympy_row, **eval_overrides("swe")}, 99), "500")

    assert groups.check_episode_group(Args(), late).keep is True
    assert groups.check_episode_group(Args(), early).keep is True
    assert [s.status for s in early] == [Status.COMPLETED, Status.FAILED] * 2
    for task_row in (sympy_row, other):  # nothing left for the task, nothing for another task
        group = [await episode(server, input_sample(task_row, 10 + i, 2), "ok") for i in range(3)]
        aborted = copy.deepcopy(input_sample(task_row, 13, 2))
        aborted.status = Status.ABORTED
        assert groups.check_episode_group(Args(), [*group, aborted]).reason == "group_has_aborted"


async def test_a_group_without_enough_valid_episodes_is_still_dropped(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    group = [await episode(server, input_sample(sympy_row, i), m) for i, m in enumerate(["ok", "500", "500", "500"])]
    out = groups.check_episode_group(Args(), group)
    assert (out.keep, out.reason) == (False, "nemogym_agent_run_error")
    assert current().held.clear() == 0  # each was given back to its sample


def test_held_episodes_are_bounded_the_oldest_going_first() -> None:
    held = HeldEpisodes(limit=2)
    for episode_id in ("e1", "e2", "e3"):
        held.hold("task", episode_id, {"id": episode_id})
    assert [held.claim("task"), held.claim("task"), held.claim("task")] == [{"id": "e2"}, {"id": "e3"}, None]


async def test_an_episode_the_server_itself_cancelled_before_the_policy_is_salvaged(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    # NeMo-Gym's own 'cancelled' verdict is a paid, failed episode, not our abort: held and given
    # back like any other failure, whatever its kind is named.
    group = [await episode(server, input_sample(sympy_row, i), "ok") for i in range(3)]
    server.result = {**server.result, "mask_sample": True, "failure_kind": "cancelled", "failure_reason": "shutdown"}
    assert (await call({**sympy_row, "session_server_id": "127.0.0.1:39999"}))["nemogym"]["failure_kind"] == "cancelled"
    cancelled = copy.deepcopy(input_sample(sympy_row, 3))  # no model call: Miles' ABORTED copy
    cancelled.status = Status.ABORTED

    out = groups.check_episode_group(Args(), [*group, cancelled])
    assert (out.keep, out.reason) == (True, None)
    assert (cancelled.status, cancelled.remove_sample, cancelled.metadata["nemogym"]["failure_kind"]) == (
        Status.FAILED,
        True,
        "cancelled",
    )
