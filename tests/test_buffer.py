"""``miles_nemogym.buffer.EpisodeBuffer`` without Miles: what it keeps, drops, counts and hands back.

Samples are what Miles' ``agentic_tool_call`` returns (``tests/test_salvage_before_policy.py``'s
``episode``, over a real loopback ``/run``). Through Miles' real ``FullyAsyncRolloutFn``:
``tests/integration/test_miles_fully_async.py``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from miles_nemogym.buffer import EpisodeBuffer
from miles_nemogym.errors import RunStopped
from miles_nemogym.runtime import current
from tests.support.agent_fixtures import episode, fast_env, input_sample, server
from tests.support.circuits import held_count
from tests.support.fault_server import FaultServer
from tests.support.runtime_settings import UseSettings
from tests.support.samples import BufferArgs as Args
from tests.support.samples import BufferConstructor as Constructor
from tests.support.samples import BufferEntry as Entry
from tests.support.samples import Sample, Status

__all__ = ["fast_env", "server"]  # fixtures used by name
pytestmark = pytest.mark.usefixtures("fast_env")


def buffer(**kwargs: Any) -> tuple[EpisodeBuffer, list[list[Any]]]:
    unused: list[list[Any]] = []
    return EpisodeBuffer(Constructor(Args(**kwargs), unused.append)), unused


async def group(server: FaultServer, row: dict[str, Any], modes: list[str], index: int = 0) -> Entry:
    prompts = [input_sample(row, 4 * index + i, group=index) for i in range(len(modes))]
    return Entry(prompts, [await episode(server, p, m) for p, m in zip(prompts, modes, strict=True)])


async def test_a_group_with_an_episode_failed_before_the_policy_is_salvaged_and_counted_when_trained(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    episodes, unused = buffer()
    entry = await group(server, sympy_row, ["ok", "500", "ok", "ok"])
    assert entry.group[1].status is Status.ABORTED  # what Miles' DefaultDataBuffer drops
    await episodes.put(entry)
    assert current().ledger.drain().groups_salvaged == 0  # counted at the step that trains it, not before
    got = await asyncio.wait_for(episodes.get(current_version=None), 1)
    assert got is entry and unused == []
    assert (got.group[1].status, got.group[1].remove_sample) == (Status.FAILED, True)
    assert current().ledger.drain().groups_salvaged == 1
    m = episodes.get_metrics()
    assert m["nemogym/buffer/episodes_dropped"] == 0.0 and m["rollout/fully_async/aborted_groups_filtered"] == 0.0


async def test_groups_that_cannot_train_are_dropped_counted_and_only_aborted_or_stale_ones_regenerated(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    episodes, unused = buffer(async_unused_samples_handler="retry")
    too_few = await group(server, sympy_row, ["ok", "error_metadata", "error_metadata", "error_metadata"])
    await episodes.put(too_few)  # three of four failed after the policy: dropped, not regenerated
    aborted = Entry([input_sample(sympy_row, 8, 2)], [Sample(metadata={}, status=Status.ABORTED)] * 4)
    aborted.prompt_group[0].metadata["nemogym"] = {"stale": "record"}
    await episodes.put(aborted)  # Miles' own abort: nothing held to give back
    m = episodes.get_metrics()
    assert unused == [aborted.prompt_group]
    assert "nemogym" not in aborted.prompt_group[0].metadata  # a regenerated prompt starts clean
    assert (m["nemogym/buffer/groups_dropped_filtered"], m["nemogym/buffer/groups_dropped_aborted"]) == (1.0, 1.0)
    assert m["rollout/dynamic_filter/drop_nemogym_agent_run_error"] == 1.0
    assert (m["nemogym/buffer/episodes_dropped"], m["nemogym/buffer/groups_regenerated"]) == (8.0, 1.0)
    assert m["nemogym/buffer/episodes_regenerated"] == 1.0
    assert m["rollout/fully_async/aborted_groups_filtered"] == 1.0
    assert current().ledger.drain().groups_dropped == 2
    assert episodes.get_metrics()["nemogym/buffer/episodes_dropped"] == 0.0  # a window: reset at each call


@dataclass
class Versioned(Sample):
    oldest_weight_version: int | None = None


async def test_stale_groups_are_dropped_at_get_and_handed_to_the_unused_handler() -> None:
    episodes, unused = buffer(max_weight_staleness=1)
    record = {"status": "ok", "mask_sample": False}
    stale = Entry(
        ["p0"],
        [Versioned(metadata={"nemogym": {**record, "episode_id": f"s{i}"}}, oldest_weight_version=1) for i in range(4)],
    )
    fresh = Entry(
        ["p1"],
        [Versioned(metadata={"nemogym": {**record, "episode_id": f"f{i}"}}, oldest_weight_version=3) for i in range(4)],
    )
    await episodes.put(stale)
    await episodes.put(fresh)
    assert episodes.get_metrics()["nemogym/buffer/episodes_buffered"] == 8.0
    assert await asyncio.wait_for(episodes.get(current_version=4), 1) is fresh
    assert unused == [["p0"]]
    m = episodes.get_metrics()
    assert (m["nemogym/buffer/groups_dropped_stale"], m["rollout/fully_async/stale_groups_filtered"]) == (1.0, 1.0)
    assert (m["rollout/fully_async/avg_staleness"], m["rollout/fully_async/max_staleness"]) == (2.0, 3.0)
    tally = current().ledger.drain()
    assert (tally.groups_dropped, tally.groups_salvaged) == (1, 0)


async def test_put_waits_for_room_and_raises_run_stopped_on_a_failure_streak(
    server: FaultServer, sympy_row: dict[str, Any], monkeypatch: pytest.MonkeyPatch, use_settings: UseSettings
) -> None:
    episodes, _ = buffer(async_data_buffer_capacity_factor=0.5)  # one group
    await episodes.put(await group(server, sympy_row, ["ok"] * 4))
    waits_for_room = asyncio.Event()
    room = episodes._cond.wait

    async def wait() -> bool:
        waits_for_room.set()
        return await room()

    monkeypatch.setattr(episodes._cond, "wait", wait)
    second = asyncio.create_task(episodes.put(await group(server, sympy_row, ["ok"] * 4, 1)))
    await asyncio.wait_for(waits_for_room.wait(), 10)
    assert not second.done()
    await episodes.get()
    await asyncio.wait_for(second, 1)
    use_settings(NEMO_GYM_MAX_FAILURE_STREAK="4")  # a new run
    failed = await group(server, sympy_row, ["500"] * 4, 2)
    with pytest.raises(RunStopped, match="4 NeMo-Gym episodes in a row failed"):
        await episodes.put(failed)


def test_another_group_filter_or_no_room_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"--dynamic-sampling-filter-path is 'x\.y'"):
        buffer(dynamic_sampling_filter_path="x.y")
    with pytest.raises(ValueError, match=r"--async-data-buffer-capacity-factor 0\.1"):
        buffer(async_data_buffer_capacity_factor=0.1)


async def test_the_store_files_trained_episodes_under_their_step_and_dropped_ones_with_the_reason(
    server: FaultServer, sympy_row: dict[str, Any], tmp_path: Any, use_settings: UseSettings
) -> None:
    from miles_nemogym import metrics
    from miles_nemogym.store._reader import UNFILED, load

    use_settings(NEMO_GYM_EPISODE_DIR=str(tmp_path))
    episodes, _ = buffer()
    early = await group(server, sympy_row, ["ok", "ok", "ok", "ok"], 0)
    later = await group(server, sympy_row, ["ok", "ok", "ok", "ok"], 1)
    await episodes.put(early)
    await episodes.put(later)
    got = await asyncio.wait_for(episodes.get(current_version=None), 1)
    fully_async = Args()
    fully_async.fully_async = True  # type: ignore[attr-defined]
    episodes.get_metrics()  # as Miles' drain ends, before the step's log
    metrics.log_rollout(0, fully_async, got.group)  # step 0 trains ``early``; ``later`` waits
    too_few = await group(server, sympy_row, ["ok", "error_metadata", "error_metadata", "error_metadata"], 2)
    await episodes.put(too_few)
    got = await asyncio.wait_for(episodes.get(current_version=None), 1)
    assert episodes.get_metrics()["nemogym/buffer/episodes_dropped"] == 4
    # Dropped after this drain's metrics were taken: counted and filed at the next step, not this one.
    late_drop = await group(server, sympy_row, ["error_metadata"] * 4, 3)
    await episodes.put(late_drop)
    metrics.log_rollout(1, fully_async, got.group)
    assert episodes.get_metrics()["nemogym/buffer/episodes_dropped"] == 4  # step 2's window
    current().stores.close()

    def ids(entry: Entry) -> set[str]:
        return {s.metadata["nemogym"]["episode_id"] for s in entry.group}

    stored = load(tmp_path)
    assert stored.problems == []
    filed: dict[tuple[int | None, str | None], set[str]] = {(e.step, e.not_trained): set() for e in stored.episodes}
    for e in stored.episodes:
        filed[(e.step, e.not_trained)].add(e.episode_id)
    # ``later`` finished before step 0's log but trained at step 1: filed under step 1.
    assert filed == {
        (0, None): ids(early),
        (1, None): ids(later),
        (1, "nemogym_agent_run_error"): ids(too_few),
        (1, UNFILED): ids(late_drop),  # sealed at step 1 as finished; no step 2 filed its drop
    }
    assert {e.episode_id for e in load(tmp_path, steps={1}).episodes} == ids(later) | ids(too_few) | ids(late_drop)
    assert {e.episode_id for e in load(tmp_path, steps={0}).episodes} == ids(early)


async def test_in_sync_mode_no_filing_is_written_and_episodes_stay_under_the_step_logged_after_them(
    server: FaultServer, sympy_row: dict[str, Any], tmp_path: Any, use_settings: UseSettings
) -> None:
    from miles_nemogym import metrics
    from miles_nemogym.store.views import load

    use_settings(NEMO_GYM_EPISODE_DIR=str(tmp_path))
    entry = await group(server, sympy_row, ["ok", "ok", "ok", "ok"])
    metrics.log_rollout(0, Args(), [])  # sync: whatever the samples, no filing
    metrics.log_rollout(1, Args(), entry.group)
    current().stores.close()
    assert not list(tmp_path.rglob("*.filing"))
    assert {e.step for e in load(tmp_path).episodes} == {0}


async def test_a_failed_episode_of_a_dropped_group_is_never_given_to_a_later_group_of_its_task(
    server: FaultServer, sympy_row: dict[str, Any]
) -> None:
    # Fully async never calls abort(), so nothing held is forgotten between steps: the episode held
    # for an ABORTED sample must leave with its group, mended or not. Else the prompt, regenerated,
    # would be given the old episode's record in place of its own (filed as trained, counted twice).
    episodes, unused = buffer(async_unused_samples_handler="retry")
    dropped = await group(server, sympy_row, ["nonjson", "error_metadata", "error_metadata", "error_metadata"])
    await episodes.put(dropped)  # no valid sibling to mend the ABORTED sample: dropped, regenerated
    assert unused == [dropped.prompt_group] and held_count(current().held) == 0
    lost = dropped.group[0].metadata["nemogym"]  # given back, so the store files it with its group's drop
    assert (dropped.group[0].status, lost["http_status"]) == (Status.ABORTED, 200)  # the answer was not JSON
    assert [reason for ids, reason in episodes._unfiled if lost["episode_id"] in ids] == ["group_has_aborted"]
    again = await group(server, sympy_row, ["ok", "500", "ok", "ok"], 1)
    await episodes.put(again)
    got = await asyncio.wait_for(episodes.get(current_version=None), 1)
    record = got.group[1].metadata["nemogym"]
    assert got is again and (record["failure_kind"], record["http_status"]) == ("agent_run_error", 500)
    assert record["episode_id"] != lost["episode_id"] and held_count(current().held) == 0
