"""What the process keeps across episodes lives in ``state.py`` (or is a cache it names), and one
``state.reset`` returns all of it to a fresh process's."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import weakref
from collections import Counter
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

import miles_nemogym
from miles_nemogym import agent, filters, log_once, metrics, reward, settings, state
from miles_nemogym.episode.run import routable_local_address
from tests.support.fault_server import FaultServer
from tests.support.ports import free_port
from tests.support.samples import Sample

PACKAGE = Path(miles_nemogym.__file__).parent

# Process-wide mutable objects outside state.py, each one either reset by state.reset or a
# process's own resource that is not state of a run (serve's live servers, the loop pools).
DECLARED = {
    "miles_nemogym.log_once._seen",  # state.reset: log_once.reset
    "miles_nemogym.settings._current",  # state.reset: settings.reset
    "miles_nemogym.transport._pools",  # per event loop, closed with it (transport.close_pools)
    "miles_nemogym.transport._exit_registered",
    "miles_nemogym.gym.server._LIVE",  # `serve`'s running servers, stopped at exit
}


def _modules() -> list[Any]:
    return [importlib.import_module(m.name) for m in pkgutil.walk_packages(miles_nemogym.__path__, "miles_nemogym.")]


def _mutable(value: Any) -> bool:
    """A process-wide object that can change: a set, list, counter, weak map, an instance of a class
    of the package (a ledger, a registry), or an event."""
    if isinstance(value, (set, list, Counter, weakref.WeakKeyDictionary)):
        return True
    kind = type(value)
    if isinstance(value, type):
        return False
    if dataclasses.is_dataclass(value) and kind.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return False
    return kind.__module__.startswith("miles_nemogym") and not isinstance(value, (type, Enum))


def test_process_wide_state_lives_in_state_py_or_is_declared() -> None:
    found = set()
    for module in _modules():
        for name, value in vars(module).items():
            if name.startswith("__") or module.__name__ == "miles_nemogym.state":
                continue
            if getattr(value, "__module__", None) != module.__name__ and not _mutable(value):
                continue
            if _mutable(value) and not isinstance(value, (type, tuple, frozenset)):
                found.add(f"{module.__name__}.{name}")
        source = ast.parse(Path(module.__file__).read_text())
        for node in ast.walk(source):
            if isinstance(node, ast.Global):
                found.update(f"{module.__name__}.{name}" for name in node.names)
    found.discard("miles_nemogym.transport._exit_registered")  # an Event is not found by _mutable
    assert found == DECLARED - {"miles_nemogym.transport._exit_registered"}
    assert {name for name in vars(state) if not name.startswith("__") and _mutable(getattr(state, name))} == {
        "ledger",
        "circuits",
        "in_flight",
        "held",
        "stores",
        "reward_problems",
    }


async def test_one_reset_returns_everything_to_a_fresh_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sympy_row: dict[str, Any], sympy_result: dict[str, Any]
) -> None:
    monkeypatch.setenv("NEMO_GYM_EPISODE_DIR", str(tmp_path / "episodes"))
    monkeypatch.setenv("NEMO_GYM_OUTAGE_TIMEOUT", "0.3")
    filters.check_episode_group(None, [])  # no salvage hook wired: warned once
    server = await FaultServer(result=sympy_result, mode="500").start()
    try:
        monkeypatch.setenv("NEMO_GYM_URL", server.url)
        failed = await agent.run(base_url="http://127.0.0.1:1/sessions/a", metadata=sympy_row)
    finally:
        await server.stop()
    monkeypatch.setenv("NEMO_GYM_URL", f"http://127.0.0.1:{free_port()}")  # down: its circuit gives up
    down = await agent.run(base_url="http://127.0.0.1:1/sessions/b", metadata=sympy_row)
    assert failed["nemogym"]["mask_sample"] and down["nemogym"]["failure_kind"] == "transport_unreachable"
    await reward.reward_func(None, Sample(metadata={"reward": None}))
    routable_local_address("localhost")
    stored = state.stores.get(str(tmp_path / "episodes"))
    read = settings.get_settings()
    assert state.ledger.streak()[0] == 2 and filters.stop_reason(read) is not None
    assert len(state.held) == 2 and state.reward_problems and routable_local_address.cache_info().currsize == 1
    assert not log_once.log_once(metrics.logger, 10, "salvage not wired", "x")  # already logged

    state.reset()

    assert filters.stop_reason(settings.get_settings()) is None and settings.get_settings() is not read
    assert not state.circuits.is_open and state.circuits.waiting() == 0
    assert state.ledger.streak() == (0, {}) and state.ledger.drain().episodes == 0
    assert len(state.held) == 0 and not state.reward_problems
    assert routable_local_address.cache_info().currsize == 0
    assert state.stores.get(str(tmp_path / "episodes")) is not stored  # the old one was closed
    assert log_once.log_once(metrics.logger, 10, "salvage not wired", "x")  # logged again, once


# Caches of a pure function of their arguments and the pinned files: never stale, never reset.
PURE_CACHES = {
    "miles_nemogym.filters._output_type",  # an import
    "miles_nemogym.salvage._miles_post_process",  # an import
    "miles_nemogym.gym.wheel._archive",  # keyed by the wheel's path, mtime and size
    "miles_nemogym.gym.composition._member",  # a member of the pinned wheel
    "miles_nemogym.gym.environments._catalog_folders",  # keyed by the wheel's path
    "miles_nemogym.redaction.key_scrubber",  # keyed by the secret
}
# Caches of what the host or network says: emptied by state.reset.
RESET_CACHES = {"miles_nemogym.episode.run.routable_local_address"}
# Read once per process, as a process reads its environment: the system's CA certificates.
PROCESS_CACHES = {"miles_nemogym.transport._trust_store"}


def test_every_module_cache_is_pure_or_emptied_by_reset() -> None:
    caches = {
        f"{module.__name__}.{name}"
        for module in _modules()
        for name, value in vars(module).items()
        if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", None) == module.__name__
    }
    assert caches == PURE_CACHES | RESET_CACHES | PROCESS_CACHES


def test_a_policy_url_after_reset_asks_again_which_local_address_routes_to_the_gym_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from miles_nemogym.episode.run import policy_base_url

    session = "http://0.0.0.0:30000/sessions/abc"
    asked = "session server listens on a wildcard address"
    with caplog.at_level("INFO"):
        assert policy_base_url(session, "http://localhost:12000") == "http://127.0.0.1:30000/sessions/abc/v1"
        state.reset()
        caplog.clear()
        policy_base_url(session, "http://localhost:12000")
    assert asked in caplog.text  # the address was routed again, not taken from a stale cache
