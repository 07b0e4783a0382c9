"""A minimal sample object for unit tests of the hooks' pure rules.

It has only the attributes the hooks read from Miles' ``miles.utils.types.Sample``
(``metadata``, ``status``, ``reward``, ``remove_sample``). How Miles really builds
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

    Status = Status
