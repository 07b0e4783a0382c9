"""The wheel's example rows as the data tests take them: copies a test may change, a JSONL
file of them, and its results as the agent function returns them. (``gym_example_rows``,
``sympy_row`` and friends: tests/conftest.py.)"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.episode.run import classify_http
from tests.support.prompt_rows import write_jsonl

__all__ = ["example_jsonl", "example_rows", "first_row", "graded", "sympy_copy"]


@pytest.fixture
def example_rows(gym_example_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A deep copy of the wheel's five SWE-bench Verified rows."""
    return copy.deepcopy(gym_example_rows)


@pytest.fixture
def example_jsonl(tmp_path: Path, gym_example_rows: list[dict[str, Any]]) -> Path:
    """The wheel's five rows in ``example.jsonl`` under the test's ``tmp_path``."""
    return write_jsonl(tmp_path / "example.jsonl", gym_example_rows)


@pytest.fixture
def first_row(gym_example_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A deep copy of the wheel's first row."""
    return copy.deepcopy(gym_example_rows[0])


@pytest.fixture
def sympy_copy(sympy_row: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of the sympy row (non-empty FAIL_TO_PASS and PASS_TO_PASS)."""
    return copy.deepcopy(sympy_row)


@pytest.fixture
def graded(gym_example_rollouts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent function's sample metadata for the wheel's five real ``/run`` results, with
    distinct episode ids and times (10 s, 20 s, ...)."""
    out = []
    for i, result in enumerate(gym_example_rollouts):
        outcome = classify_http(200, json.dumps(result).encode())
        outcome.record.episode_id = f"e{i}"
        outcome.record.elapsed_s = float(10 * (i + 1))
        outcome.record.attempts = 1
        out.append(outcome.to_metadata())
    return out
