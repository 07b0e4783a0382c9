"""A ``FaultServer`` whose answers follow a script, for group-level tests.

``FaultServer`` answers every episode of an instance alike; a test of GRPO over a group needs
episodes of one prompt with different rewards and some failed after their policy calls (so Miles
still returns a sample carrying our record). Here the k-th ``/run`` of an instance gets the k-th
entry of its script.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from tests.support.fault_server import FaultServer, Mode

ERROR = "error_metadata"
"""Script entry: the server's ``{error, traceback}`` result (``agent_run_error``, masked)."""
START_ERROR = "500"
"""Script entry: HTTP 500 before any policy call, as when the sandbox could not start."""
HOLD = "hold"
"""Script entry: after the policy calls, no answer until the client hangs up (or the server stops)."""


@dataclass
class ScriptedGym(FaultServer):
    """Per instance, a list of answers: a reward (the graded ``result`` with that reward),
    ``ERROR``, ``START_ERROR`` or ``HOLD``; each ``/run`` but a ``START_ERROR`` first makes
    ``policy_calls`` model calls, as an episode does."""

    scripts: dict[str, list[float | str]] = field(default_factory=dict)
    fail_rate: float = 0.0
    """For instances without a script: the chance an episode fails after its policy calls;
    the others score 0.0 or 1.0 at random (seeded by ``seed``)."""
    start_fail_rate: float = 0.0
    """For instances without a script: the chance an episode fails before any policy call."""
    even: bool = False
    """Spread the failures evenly over the ``/run`` calls in arrival order instead of drawing
    them: exactly ``start_fail_rate`` (or ``fail_rate``, when used alone) of them fail."""
    seed: int = 0
    _seen: dict[str, int] = field(default_factory=dict)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def mode_for(self, body: dict[str, Any]) -> Mode:
        instance = str(body.get("instance_id"))
        k = self._seen.get(instance, 0)
        self._seen[instance] = k + 1
        script = self.scripts.get(instance)
        if script:
            return script[k % len(script)]
        if self.even:
            n = len(self.bodies)  # the n-th /run fails where the running count of failures steps up
            if int(n * self.start_fail_rate) > int((n - 1) * self.start_fail_rate):
                return START_ERROR
            if int(n * self.fail_rate) > int((n - 1) * self.fail_rate):
                return ERROR
            return float(self._rng.random() < 0.5)
        draw = self._rng.random()
        if draw < self.start_fail_rate:
            return START_ERROR
        if draw < self.start_fail_rate + self.fail_rate:
            return ERROR
        return float(self._rng.random() < 0.5)
