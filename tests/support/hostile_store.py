"""Episode stores with crafted content, written line by line as a careless or hostile
writer could leave them, for the ``episodes`` views' tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_step(folder: Path, role: str, step: int, entries: list[dict[str, Any] | str]) -> Path:
    """``entries`` as ``<folder>/<role>/step-NNNNNN.jsonl``, one a line (a str is written as is)."""
    path = folder / role / f"step-{step:06d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [entry if isinstance(entry, str) else json.dumps(entry) for entry in entries]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def run_answer(
    output: list[Any], *, patch: str = "", report: Any = None, instance: str = "repo__x-1"
) -> dict[str, Any]:
    """A ``/run`` answer with this Responses ``output``, patch and eval report."""
    return {
        "response": {"output": output},
        "reward": 1.0,
        "metadata": {"model_patch": patch, "eval_report": {instance: report} if report is not None else {}},
    }


def entry(episode_id: str, answer: Any = None, **fields: Any) -> dict[str, Any]:
    """A store line for one valid episode; ``fields`` override the line's or, as
    ``record={...}``, are merged into its record."""
    record: Any = {
        "status": "ok",
        "episode_id": episode_id,
        "instance_id": "repo__x-1",
        "mask_sample": False,
        "resolved": True,
        "attempts": 1,
        "elapsed_s": 3.0,
        "turns": 1,
        "tool_calls": 1,
    }
    override = fields.pop("record", {})
    record = {**record, **override} if isinstance(override, dict) else override
    line = {
        "episode_id": episode_id,
        "instance_id": "repo__x-1",
        "repo": "repo",
        "role": "train",
        "eval_set": None,
        "session_id": f"s-{episode_id}",
        "finished_at": 1.0,
        "reward": 1.0,
        "record": record,
        "answer": answer,
    }
    line.update(fields)
    return line
