"""A minimal sample object for unit tests of the hooks' pure rules.

It has only the attributes the hooks read or set on Miles' ``miles.utils.types.Sample``
(``metadata``, ``status``, ``reward``, ``remove_sample``, and the token fields a recovered
failed episode is given), with Miles' defaults. How Miles really builds
samples, calls the hooks and merges the agent's dict is tested against Miles itself in
``tests/integration/test_miles_rollout.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from miles_nemogym.groups import POST_PROCESS_PATH


class Status(enum.Enum):
    """The values of Miles' ``Sample.Status``."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class Sample:
    prompt: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    status: Status = Status.COMPLETED
    reward: float | None = None
    remove_sample: bool = False
    group_index: int | None = None
    index: int | None = None
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    teacher_log_probs: list[float] | None = None
    opd_reverse_kl: list[float] | None = None
    rollout_routed_experts: Any = None
    rollout_indexer_topk: Any = None
    weight_versions: list[str] = field(default_factory=list)

    Status = Status


# Miles' fully async data buffer's inputs (``miles_nemogym.buffer.EpisodeBuffer``).


@dataclass
class BufferArgs:
    """The Miles arguments the buffer reads, as the launcher sets them."""

    n_samples_per_prompt: int = 4
    rollout_batch_size: int = 2
    async_data_buffer_capacity_factor: float = 2.0
    async_unused_samples_handler: str = "drop"
    max_weight_staleness: int | None = None
    dynamic_sampling_filter_path: str = "miles_nemogym.groups.check_episode_group"
    custom_reward_post_process_path: str = POST_PROCESS_PATH


@dataclass
class BufferEntry:
    """Miles' ``DataBufferInput``."""

    prompt_group: list[Any]
    group: list[Any]


@dataclass
class BufferConstructor:
    """Miles' ``DataBufferConstructorInput``."""

    args: BufferArgs
    unused_handler_fn: Any
    unused: list[list[Any]] = field(default_factory=list)
