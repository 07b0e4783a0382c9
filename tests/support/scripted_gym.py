"""A loopback ``/run`` server whose answers follow a script, for group-level tests.

``tests.support.fault_server.FaultServer`` answers every episode of an instance alike; a test of
GRPO over a group needs episodes of one prompt with different rewards and some failed
after their policy calls (so Miles still returns a sample carrying our record). Here
the k-th ``/run`` of an instance gets the k-th entry of its script.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.fault_server import FaultServer
from tests.support.mini_swe_agent import call_policy


def result_for(result: dict[str, Any], instance: str) -> dict[str, Any]:
    """A real ``/run`` result answered for ``instance``: its SWE-bench report keyed by it,
    as the server grades the instance it was sent (the client checks the two match)."""
    metadata = dict(result.get("metadata") or {})
    reports = metadata.get("eval_report")
    if isinstance(reports, dict) and reports:
        metadata["eval_report"] = {instance: next(iter(reports.values()))}
    metadata["instance_id"] = instance
    return {**result, "metadata": metadata, "instance_id": instance}


ERROR = "error"
"""Script entry: the server's ``{error, traceback}`` result (``agent_run_error``, masked)."""
START_ERROR = "start_error"
"""Script entry: HTTP 500 before any policy call, as when the sandbox could not start."""
HOLD = "hold"
"""Script entry: after the policy calls, no answer until the client hangs up (at most 120 s)."""


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

    async def _run(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        instance = str(body.get("instance_id"))
        k = self._seen.get(instance, 0)
        self._seen[instance] = k + 1
        script = self.scripts.get(instance)
        if script:
            answer = script[k % len(script)]
        elif self.even:
            n = len(self.bodies)  # the n-th /run fails where the running count of failures steps up
            if int(n * self.start_fail_rate) > int((n - 1) * self.start_fail_rate):
                answer = START_ERROR
            elif int(n * self.fail_rate) > int((n - 1) * self.fail_rate):
                answer = ERROR
            else:
                answer = float(self._rng.random() < 0.5)
        else:
            draw = self._rng.random()
            if draw < self.start_fail_rate:
                answer = START_ERROR
            elif draw < self.start_fail_rate + self.fail_rate:
                answer = ERROR
            else:
                answer = float(self._rng.random() < 0.5)
        if answer == START_ERROR:
            return web.Response(status=500, text="Internal Server Error")
        for turn in range(self.policy_calls):
            await call_policy(body, turn)
        result = result_for(self.result, instance)
        if answer == HOLD:
            for _ in range(2400):
                if request.transport is None or request.transport.is_closing():
                    self.disconnects += 1
                    return web.Response(status=499)
                await asyncio.sleep(0.05)
        if answer == ERROR:
            metadata = {"error": "eval script failed", "traceback": "Traceback ..."}
            return web.json_response({**result, "reward": 0.0, "metadata": metadata})
        return web.json_response({**result, "reward": float(answer)})
