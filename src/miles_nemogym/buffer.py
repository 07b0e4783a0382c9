"""Miles' fully async data buffer: ``--custom-async-data-buffer-path miles_nemogym.buffer.EpisodeBuffer``.

Miles' ``DefaultDataBuffer`` drops every group holding an ABORTED sample before the group filter
sees it. This buffer does what it does (capacity, staleness at ``get``, the unused-samples handler,
Miles' ``rollout/fully_async/*`` metrics) but sends every group through ``groups.judge_group``
first; a ``RunStopped`` raised there kills Miles' rollout worker. It follows Miles' ``DataBuffer``
contract without importing Miles. Why and what is counted: docs/using-with-miles.md "Fully async".
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from miles_nemogym.episode.record import TRAIN, distinct_episodes, flatten, metadata_of, strip_result
from miles_nemogym.groups import FILTER_PATH, GROUP_HAS_ABORTED, judge_group
from miles_nemogym.runtime import current

__all__ = ["EpisodeBuffer"]

logger = logging.getLogger(__name__)

_MILES = "rollout/fully_async/"
_OURS = "nemogym/buffer/"


class EpisodeBuffer:
    """FIFO of finished groups between Miles' rollout worker and the trainer (see the module docstring)."""

    def __init__(self, input: Any) -> None:
        args = input.args
        self._args = args
        configured = getattr(args, "dynamic_sampling_filter_path", None)
        if configured not in (None, FILTER_PATH):
            raise ValueError(
                f"--dynamic-sampling-filter-path is {configured!r}, but miles_nemogym.buffer.EpisodeBuffer judges "
                f"every group with {FILTER_PATH}: set it to that, or drop --custom-async-data-buffer-path"
            )
        factor = args.async_data_buffer_capacity_factor
        self._capacity = int(factor * args.rollout_batch_size)
        if self._capacity < 1:
            raise ValueError(
                f"--async-data-buffer-capacity-factor {factor} x --rollout-batch-size {args.rollout_batch_size} "
                "holds no group: raise the factor so the product is at least 1"
            )
        self._unused: Callable[[list[Any]], None] = input.unused_handler_fn
        self._retry = getattr(args, "async_unused_samples_handler", "drop") == "retry"
        self._buffer: list[tuple[Any, bool]] = []  # (DataBufferInput, salvaged)
        self._cond = asyncio.Condition()
        self._current_version: int | None = None
        self._window: Counter[str] = Counter()
        self._unfiled: list[tuple[list[str], str]] = []  # dropped episodes and why, for the store
        self._consumed_staleness: list[int] = []

    async def put(self, input: Any) -> None:
        """Judge the finished group (salvage, the run-stop check); buffer it, or drop it counted."""
        reason, salvaged = judge_group(self._args, input.group)  # RunStopped ends the worker: wanted
        if reason is not None:
            # Aborted groups our salvage could not mend (Miles' own abort) go to Miles' handler as
            # DefaultDataBuffer sends them; groups of too few valid episodes are dropped, as its filter's.
            self._drop("aborted" if reason == GROUP_HAS_ABORTED else "filtered", reason, input)
            return
        async with self._cond:
            while len(self._buffer) >= self._capacity:
                await self._cond.wait()
            self._buffer.append((input, salvaged))
            self._cond.notify_all()

    async def get(self, current_version: int | None = None, **_: Any) -> Any:
        """The oldest buffered group within ``--max-weight-staleness``; staler ones are dropped counted."""
        if current_version is not None:
            self._current_version = current_version
        limit = getattr(self._args, "max_weight_staleness", None)
        async with self._cond:
            while True:
                while not self._buffer:
                    await self._cond.wait()
                entry, salvaged = self._buffer.pop(0)
                self._cond.notify_all()  # wake a producer blocked on a full buffer
                staleness = _staleness(entry.group, current_version)
                if staleness is not None:
                    self._consumed_staleness.append(staleness)
                if staleness is None or limit is None or staleness <= limit:
                    current().ledger.record_group(kept=True, salvaged=salvaged)  # counted at the step that trains it
                    return entry
                logger.info("dropped a stale group (staleness %d > --max-weight-staleness %d)", staleness, limit)
                self._drop("stale", "stale", entry)

    def get_metrics(self) -> dict[str, float]:
        """Miles' ``rollout/fully_async/*`` and our ``nemogym/buffer/*`` since the last call."""
        window, self._window = self._window, Counter()
        # Filed at the seal after this call, the step whose metrics count them (a later drop: the next step's).
        unfiled, self._unfiled = self._unfiled, []
        for episode_ids, reason in unfiled:
            current().stores.not_trained_all(TRAIN, episode_ids, reason)
        consumed, self._consumed_staleness = self._consumed_staleness, []
        metrics: dict[str, float] = {
            f"{_MILES}queue_size": float(len(self._buffer)),
            f"{_MILES}aborted_groups_filtered": float(window["groups_dropped_aborted"]),
            f"{_MILES}stale_groups_filtered": float(window["groups_dropped_stale"]),
            f"{_OURS}groups_buffered": float(len(self._buffer)),
            f"{_OURS}episodes_buffered": float(sum(_episodes(entry.group) for entry, _ in self._buffer)),
        }
        for name in ("aborted", "filtered", "stale"):
            metrics[f"{_OURS}groups_dropped_{name}"] = float(window[f"groups_dropped_{name}"])
        for name in ("episodes_dropped", "groups_regenerated", "episodes_regenerated"):
            metrics[f"{_OURS}{name}"] = float(window[name])
        for key, count in window.items():
            if key.startswith("reason:"):
                metrics[f"rollout/dynamic_filter/drop_{key[7:]}"] = float(count)
        if consumed:
            metrics[f"{_MILES}avg_staleness"] = sum(consumed) / len(consumed)
            metrics[f"{_MILES}max_staleness"] = float(max(consumed))
        buffered = [s for e, _ in self._buffer if (s := _staleness(e.group, self._current_version)) is not None]
        if buffered:
            metrics[f"{_MILES}buffer_avg_staleness"] = sum(buffered) / len(buffered)
            metrics[f"{_MILES}buffer_max_staleness"] = float(max(buffered))
        return metrics

    def _drop(self, kind: str, reason: str, entry: Any) -> None:
        """Count a group that will not train; aborted and stale ones go to Miles' unused handler."""
        current().ledger.record_group(kept=False, salvaged=False)
        dropped = [e.record.episode_id for e in distinct_episodes(flatten(entry.group)) if e.record.episode_id]
        self._unfiled.append((dropped, reason))
        episodes = _episodes(entry.group)
        self._window[f"groups_dropped_{kind}"] += 1
        self._window["episodes_dropped"] += episodes
        if kind == "filtered":
            self._window[f"reason:{reason}"] += 1
            return
        if self._retry:
            self._window["groups_regenerated"] += 1
            self._window["episodes_regenerated"] += len(entry.prompt_group)
            for sample in entry.prompt_group:  # a regenerated prompt must not carry the old episode's record
                strip_result(metadata_of(sample))
        self._unused(entry.prompt_group)


def _episodes(group: Any) -> int:
    """Episodes in a group: one per item (under session server v2 an item is a list of samples)."""
    return len(group) if isinstance(group, list) else sum(1 for _ in flatten(group))


def _staleness(group: Any, current_version: int | None) -> int | None:
    """``current_version`` minus the group's oldest sample weight version, or None when either is unknown."""
    versions = [v for s in flatten(group) if isinstance(v := getattr(s, "oldest_weight_version", None), int)]
    if not versions or current_version is None:
        return None
    return current_version - min(versions)
