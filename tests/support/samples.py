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
