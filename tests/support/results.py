"""Real ``/run`` results (from the nemo-gym wheel), edited into the cases a test needs."""

from __future__ import annotations

import copy
from typing import Any


def partially_passing(result: dict[str, Any], passed: int) -> dict[str, Any]:
    """``result`` (unresolved) with its first ``passed`` FAIL_TO_PASS tests now passing.

    Under ``NEMO_GYM_REWARD_MODE=partial`` its reward is ``passed / len(FAIL_TO_PASS)``
    while the server's own (binary) reward stays 0.0.
    """
    out = copy.deepcopy(result)
    report = out["metadata"]["eval_report"][out["instance_id"]]
    assert not report["resolved"], "start from an unresolved result"
    f2p = report["tests_status"]["FAIL_TO_PASS"]
    moved, f2p["failure"] = f2p["failure"][:passed], f2p["failure"][passed:]
    f2p["success"] = [*f2p["success"], *moved]
    assert not report["tests_status"]["PASS_TO_PASS"]["failure"], "a PASS_TO_PASS failure earns 0 in partial mode"
    return out
