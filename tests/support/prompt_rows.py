"""Task rows as files: the wheel's example rows as the converter writes them, and JSONL."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` written to ``path``, one JSON object a line."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def converter_rows(example_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The example rows as the converter writes them: ``{"prompt", "metadata"}``."""
    return [
        {"prompt": [{"role": "user", "content": row["problem_statement"]}], "metadata": copy.deepcopy(row)}
        for row in example_rows
    ]


def environment_rows(env: str, count: int, tools: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """``count`` prompt rows of environment ``env`` as the converter writes them: the input
    messages as the prompt, the NeMo-Gym task row (giving the model ``tools``) and the marks."""
    rows = []
    for index in range(count):
        messages = [{"role": "user", "content": f"{env} task {index}"}]
        params: dict[str, Any] = {"input": messages}
        if tools:
            params["tools"] = [
                {"type": "function", "name": tool, "parameters": {"type": "object"}, "strict": False} for tool in tools
            ]
        task = {"responses_create_params": params, "expected_answer": "B"}
        metadata = {**task, "nemogym_env": env, "nemogym_task_id": f"{env}/{index}"}
        rows.append({"prompt": messages, "metadata": metadata})
    return rows
