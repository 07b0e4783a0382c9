"""The task rows a NeMo-Gym resources server ships (``data/example.jsonl`` in the pinned wheel)."""

from __future__ import annotations

import functools
import json
from typing import Any

from miles_nemogym.gym import wheel as gym_wheel


@functools.cache  # the wheel is 43 MB: its index is read once per test session
def shipped_text(environment: str) -> bytes:
    """The resources server's ``data/example.jsonl`` as the wheel holds it."""
    return gym_wheel.read_member(f"resources_servers/{environment}/data/example.jsonl")


def shipped_rows(environment: str) -> list[dict[str, Any]]:
    """Its rows, one dict each."""
    return [json.loads(line) for line in shipped_text(environment).decode("utf-8").splitlines() if line.strip()]
