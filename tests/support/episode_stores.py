"""A small episode store built from the wheel's real ``/run`` results, for browser tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from miles_nemogym.episode.record import EpisodeRecord
from miles_nemogym.store import EpisodeStore, entry_for


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


def verify_answer(reward: float, answer: str, **fields: Any) -> dict[str, Any]:
    """A resources server's ``/verify`` answer for a one-turn episode that wrote ``answer``."""
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}
    return {"responses_create_params": {"input": []}, "response": {"output": [message]}, "reward": reward, **fields}


def build_env_store(folder: Path) -> Path:
    """Train steps 1 and 2 mixing SWE, ``mcqa`` and ``workplace_assistant`` episodes (a partial
    credit 0.5, one set aside), eval step 2 of one set mixing ``mcqa`` and SWE."""
    store = EpisodeStore(folder)

    def add(role: str, episode_id: str, env: str | None, reward: float, *, kind: str | None = None,
            instance: str | None = None, resolved: bool | None = None, turns: int = 2) -> None:  # fmt: skip
        task = instance or (f"{env}/{episode_id}" if env else f"o__r-{episode_id}")
        record = EpisodeRecord(
            status="failed" if kind else "ok", episode_id=episode_id, instance_id=task, mask_sample=bool(kind),
            failure_kind=kind, attempts=1, elapsed_s=4.0, turns=None if kind else turns, tool_calls=1,
            environment=env, resolved=resolved, server_reward=None if kind else reward,
        )  # fmt: skip
        entry = entry_for(record=record, reward=reward, role=role, eval_set="mixed" if role == "eval" else None,
                          session=f"s-{episode_id}", repo=None if env else "o/r")  # fmt: skip
        answer = None if kind else json.dumps(verify_answer(reward, f"\\boxed{{{episode_id}}}", extracted_answer="B"))
        store.add(role, entry, None if answer is None else answer.encode(), not kind)

    add("train", "s1", None, 1.0, resolved=True, turns=10)
    add("train", "s2", None, 0.0, resolved=False, turns=20)
    add("train", "m1", "mcqa", 1.0, turns=1)
    add("train", "m2", "mcqa", 0.0, turns=1)
    add("train", "w1", "workplace_assistant", 0.5, turns=4)
    add("train", "w2", "workplace_assistant", 0.0, kind="transport_unreachable")
    store.seal("train", 1)
    add("train", "m3", "mcqa", 1.0, turns=3)
    add("train", "w3", "workplace_assistant", 1.0, turns=6)
    store.seal("train", 2)
    add("eval", "e1", "mcqa", 1.0, instance="mcqa/1")
    add("eval", "e2", "mcqa", 0.0, instance="mcqa/1")
    add("eval", "e3", None, 1.0, instance="o__r-1", resolved=True)
    add("eval", "e4", None, 0.0, instance="o__r-1", resolved=False)
    store.seal("eval", 2)
    store.close()
    return folder


FAILED_IDS = {"offline": "5f0c2a9e8b7d4c1fa3e6b2d9c8a7f1e0", "crash": "a1b2c3d4e5f60718293a4b5c6d7e8f90"}
"""Two set-aside SWE episodes of ``build_failed_store``, with uuid4-hex ids as the trainer writes them."""


def ray_traceback(last: str, lines: int = 90) -> str:
    """A Ray task traceback of ``lines`` lines ending in ``last``, as ``/run`` answers carry them."""
    frames = [
        f'  File "/venv/lib/python3.12/site-packages/ray/_private/worker.py", line {n}, in get'
        for n in range(lines - 2)
    ]
    return "\n".join(["Traceback (most recent call last):", *frames, last])


def build_failed_store(folder: Path) -> Path:
    """Train step 1 of two episodes set aside with 0 turns and 0 tool calls while the smoke
    policy answered 3 requests, each with a 90-line Ray traceback as the server's error: one
    smoke's expected no-network failure (django's eval script fetches from GitHub), one not."""
    store = EpisodeStore(folder)
    offline = ray_traceback(
        "ray.exceptions.RayTaskError(ConnectionError): HTTPSConnectionPool(host='raw.githubusercontent.com', "
        "port=443): Max retries exceeded"
    )
    crash = ray_traceback("ray.exceptions.RayTaskError(RuntimeError): sandbox died: exit status 137")
    for key, error, instance in (
        ("offline", offline, "django__django-11099"),
        ("crash", crash, "astropy__astropy-12907"),
    ):
        record = EpisodeRecord(
            status="failed", episode_id=FAILED_IDS[key], instance_id=instance, mask_sample=True,
            failure_kind="agent_run_error", failure_reason=error.splitlines()[-1], http_status=500, attempts=1,
            elapsed_s=41.0, turns=0, tool_calls=0,
        )  # fmt: skip
        session = f"miles-session-{FAILED_IDS[key]}-rollout-0001"
        entry = entry_for(record=record, reward=0.0, role="train", eval_set=None, session=session,
                          repo=instance.split("__")[0])  # fmt: skip
        entry["policy_calls"] = 3
        store.add("train", entry, json.dumps({"metadata": {"error": error}}).encode(), True)
    store.seal("train", 1)
    store.close()
    return folder
