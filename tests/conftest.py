"""Shared test fixtures."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from miles_nemogym.gym import wheel as gym_wheel

# `gym` (an /openapi.json stand-in) and `fake_gym` (the scan's /run stand-in) for every module.
pytest_plugins = ["tests.support.openapi", "tests.support.fake_gym"]


@pytest.fixture(autouse=True)
def fresh_run_state() -> Iterator[None]:
    """Each test starts with the process's circuit closed, an empty ledger and no held episode."""
    from miles_nemogym.episode.circuit import circuit
    from miles_nemogym.rollout.ledger import ledger
    from miles_nemogym.salvage import forget_held_episodes

    circuit.reset()
    ledger.reset()
    forget_held_episodes()
    yield
    circuit.reset()
    ledger.reset()
    forget_held_episodes()


@pytest.fixture(autouse=True)
async def gym_pools_closed() -> AsyncIterator[None]:
    """The ``/run`` connection pools a test opened on its event loop are closed when it ends.

    Else aiohttp reports each one as "Unclosed client session" when the process exits.
    """
    yield
    from miles_nemogym.episode.client import close_client

    await close_client()


@pytest.fixture
def swebench_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import swebench`` raises ImportError, as where the optional dependency is not installed."""
    for name in [m for m in sys.modules if m == "swebench" or m.startswith("swebench.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "swebench", None)


@pytest.fixture(scope="session")
def gym_example_rows() -> list[dict[str, Any]]:
    """The five real SWE-bench Verified rows from the pinned nemo-gym wheel."""
    return gym_wheel.example_rows()


@pytest.fixture(scope="session")
def gym_example_rollouts() -> list[dict[str, Any]]:
    """The five real /run results from the pinned nemo-gym wheel."""
    return gym_wheel.example_rollouts()


@pytest.fixture
def sympy_row(gym_example_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The real sympy row: its eval script builds offline, so it grades on the local sandbox."""
    return next(row for row in gym_example_rows if row["instance_id"].startswith("sympy"))


@pytest.fixture
def sympy_result(gym_example_rollouts: list[dict[str, Any]]) -> dict[str, Any]:
    """The real /run result the wheel ships for the sympy row."""
    return next(r for r in gym_example_rollouts if r["instance_id"].startswith("sympy"))
