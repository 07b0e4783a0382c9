"""A small episode store built from the wheel's real ``/run`` results, for browser tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from miles_nemogym.episode.record import EpisodeRecord
from miles_nemogym.store.writer import EpisodeStore, entry_for


def record_of_result(result: dict[str, Any], episode_id: str, *, failed: str | None = None) -> dict[str, Any]:
    report = result["metadata"]["eval_report"][result["instance_id"]]
    if failed:
        return {"status": "failed", "episode_id": episode_id, "instance_id": result["instance_id"],
                "mask_sample": True, "failure_kind": failed, "failure_reason": "HTTP 500: boom",
                "attempts": 1, "elapsed_s": 2.0, "turns": None}  # fmt: skip
    return {
        "status": "ok",
        "episode_id": episode_id,
        "instance_id": result["instance_id"],
        "mask_sample": False,
        "resolved": bool(report["resolved"]),
        "patch_applied": bool(report["patch_successfully_applied"]),
        "attempts": 1,
        "elapsed_s": 30.0,
        "turns": 3,
    }


def build_store(folder: Path, results: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Step 1 train: every result once + one crashed episode; step 1 eval: the first result
    twice (two samples of one instance); then one pending train episode. Returns the ids."""
    store = EpisodeStore(folder)
    ids: dict[str, list[str]] = {"train": [], "eval": [], "pending": []}

    def add(role: str, result: dict[str, Any], episode_id: str, failed: str | None = None) -> None:
        record = EpisodeRecord.model_validate(record_of_result(result, episode_id, failed=failed))
        entry = entry_for(record=record, reward=0.0 if failed else float(result["reward"]), role=role,
                          eval_set="verified" if role == "eval" else None, session=f"s-{episode_id}",
                          repo=result["instance_id"].split("__")[0])  # fmt: skip
        answer = None if failed else json.dumps(result).encode()
        store.add(role, entry, answer if not failed else b"Internal Server Error", not failed)

    for i, result in enumerate(results):
        add("train", result, f"train{i}")
        ids["train"].append(f"train{i}")
    add("train", results[0], "crash0", failed="agent_run_error")
    ids["train"].append("crash0")
    store.seal("train", 1)
    for i in range(2):
        add("eval", copy.deepcopy(results[0]), f"eval{i}")
        ids["eval"].append(f"eval{i}")
    store.seal("eval", 1)
    add("train", results[1], "late0")
    ids["pending"].append("late0")
    store.close()
    return ids
