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
