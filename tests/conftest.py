"""Shared test fixtures."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from miles_nemogym.gym import wheel as gym_wheel

# `gym` (an /openapi.json stand-in) and `gym_in_thread` (the /run stand-in on its own thread) for every
# module, the example rows and the episode stores tests browse; `tiers` leaves the slow tiers out of `-m`
# runs that do not name them.
pytest_plugins = [
    "tests.support.openapi",
    "tests.support.fault_server",
    "tests.support.tiers",
    "tests.support.clean_env",
    "tests.support.row_fixtures",
    "tests.support.store_fixtures",
    "tests.support.runtime_settings",
]


@pytest.fixture(autouse=True)
async def fresh_process_state() -> AsyncIterator[None]:
    """Each test starts as in a fresh process (``state.reset``: no circuit, empty ledger, nothing
    held, logged once or counted, settings re-read, no store open) and leaves no connection pool
    open on its event loop (else aiohttp reports "Unclosed client session")."""
    from miles_nemogym.runtime import install
    from miles_nemogym.transport import close_pools

    install()
    yield
    await close_pools()
    install()


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
