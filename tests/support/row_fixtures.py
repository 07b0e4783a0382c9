"""The wheel's example rows as the data tests take them: copies a test may change, and a JSONL
file of them. (``gym_example_rows``, ``sympy_row`` and friends: tests/conftest.py.)"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.support.prompt_rows import write_jsonl

__all__ = ["example_jsonl", "example_rows", "first_row", "sympy_copy"]


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
