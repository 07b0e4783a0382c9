"""A crafted episode store for the plots over rollout steps: three train steps (one with no
valid episode), two eval sets (one with 4 samples per instance, one with 1), failures of
several kinds, a wrong-typed reward and time, markup in an eval set's and a kind's name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.hostile_store import entry, write_step

ODD_SET = '<b>lite&"</b>'
ODD_KIND = "<i>odd&kind</i>"


def _episode(episode_id: str, resolved: bool, elapsed: Any = 10.0, **fields: Any) -> dict[str, Any]:
    return entry(episode_id, reward=1.0 if resolved else 0.0, record={"resolved": resolved, "elapsed_s": elapsed},
                 **fields)  # fmt: skip


def _failed(episode_id: str, kind: str, attempts: int, elapsed: float, **fields: Any) -> dict[str, Any]:
    record = {"mask_sample": True, "resolved": None, "failure_kind": kind, "attempts": attempts, "elapsed_s": elapsed}
    return entry(episode_id, reward=0.0, record=record, **fields)


def _eval(episode_id: str, instance: str, resolved: bool, eval_set: str = "verified") -> dict[str, Any]:
    return _episode(episode_id, resolved, role="eval", eval_set=eval_set, instance_id=instance)


def build_plot_store(folder: Path) -> Path:
    """Train steps 1, 2, 4; eval set ``verified`` at steps 2 and 4 (4 samples per instance),
    eval set ``ODD_SET`` at step 4 (1 sample); one pending train episode."""
    write_step(folder, "train", 1, [
        _episode("t1a", True, 10.0), _episode("t1b", False, 20.0), _episode("t1c", True, 30.0),
        _failed("t1d", "agent_run_error", 1, 5.0),
    ])  # fmt: skip
    write_step(folder, "train", 2, [
        _failed("t2a", "agent_timeout", 1, 40.0), _failed("t2b", ODD_KIND, 0, 0.0),  # never sent: no time
    ])  # fmt: skip
    write_step(folder, "train", 4, [
        _episode("t4a", True, 12.0), _episode("t4b", True, 14.0), _episode("t4c", False, 100.0),
        {**_episode("t4d", True, "slow"), "reward": "x"},  # wrong types: left out of the mean and the times
    ])  # fmt: skip
    eval_2: list[dict[str, Any] | str] = [_eval(f"a{i}", "A", i == 0) for i in range(4)]
    eval_2 += [_eval(f"b{i}", "B", i == 2) for i in range(3)]
    eval_2.append({**_failed("b3", "transport_timeout", 1, 1.0), "role": "eval", "eval_set": "verified",
                   "instance_id": "B"})  # fmt: skip
    write_step(folder, "eval", 2, eval_2)
    eval_4 = [_eval(f"c{i}", "A", False) for i in range(4)] + [_eval(f"d{i}", "B", i < 2) for i in range(4)]
    write_step(folder, "eval", 4, [*eval_4, _eval("e0", "C", True, ODD_SET)])
    (folder / "train" / "pending-1-ab-1.jsonl").write_text(json.dumps(_episode("p0", True)) + "\n")
    return folder
