"""Test tiers: the slow tiers run only when asked for.

A test marked ``lint`` (ruff and mypy over the tree), ``ray`` (starts a real Ray head) or
``bench`` (runs a benchmark script) is selected by a plain ``python -m pytest`` (every tier,
as CI runs it) or by an ``-m`` expression that names its mark (``-m lint``,
``-m "not integration or lint"``). Any other ``-m`` run leaves it out, so the unit tier
``-m "not integration"`` stays fast.

Workers (pytest-xdist, ``-n auto`` in pyproject.toml): a run whose ``-m`` expression leaves out
every integration test (``-m "not integration"``, ``-m "not integration or lint"``) runs on up
to ``UNIT_WORKERS`` processes, one per core; any other run (the full ``python -m pytest``, a
path, ``-m integration``) stays in one process, so the real NeMo-Gym server, Miles and Ray are
started once and never share the cores with other tests. ``-n N`` on the command line, or
``PYTEST_XDIST_AUTO_NUM_WORKERS``, decides instead. A worker starts with ``COLUMNS=80`` and
``LINES=24`` set (execnet's doing); it gets the run's own values back, so output widths are the
same with or without workers.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

SLOW_TIERS = ("lint", "ray", "bench")
UNIT_WORKERS = 4
"""At most this many workers: past it, each worker's collection (~6 s of CPU) costs more than it saves."""


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


def without_integration(markexpr: str) -> bool:
    """Whether an ``-m`` expression leaves out every integration test: it names the mark only
    as ``not integration``."""
    named = len(re.findall(r"\bintegration\b", markexpr))
    return named > 0 and named == len(re.findall(r"\bnot\s+integration\b", markexpr))


def workers(markexpr: str, cores: int | None) -> int:
    """How many xdist workers a run with this ``-m`` expression gets on ``cores`` cores (0: none)."""
    if not without_integration(markexpr) or not cores or cores < 2:
        return 0
    return min(cores, UNIT_WORKERS)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own answer
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return workers(config.getoption("markexpr") or "", cores)


_TERMINAL = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput["terminal"] = {name: os.environ.get(name) for name in _TERMINAL}


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)  # set on an xdist worker only
    if workerinput is None:
        return
    for name, value in workerinput["terminal"].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
