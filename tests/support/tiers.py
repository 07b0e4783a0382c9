"""Test tiers: the slow tiers run only when asked for.

A test marked ``lint`` (ruff and mypy over the tree), ``ray`` (starts a real Ray head) or
``bench`` (runs a benchmark script) is selected by a plain ``python -m pytest`` (every tier,
as CI runs it) or by an ``-m`` expression that names its mark (``-m lint``,
``-m "not integration or lint"``). Any other ``-m`` run leaves it out, so the unit tier
``-m "not integration"`` stays fast.
"""

from __future__ import annotations

import re

import pytest

SLOW_TIERS = ("lint", "ray", "bench")


def left_out(markexpr: str, marks: set[str]) -> bool:
    """Whether a test with these marks is left out of a run with this ``-m`` expression."""
    if not markexpr.strip():
        return False
    named = set(re.findall(r"\w+", markexpr))
    return any(tier in marks and tier not in named for tier in SLOW_TIERS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markexpr = config.getoption("markexpr") or ""
    kept, dropped = [], []
    for item in items:
        (dropped if left_out(markexpr, {mark.name for mark in item.iter_markers()}) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
