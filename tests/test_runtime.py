"""What the process keeps across episodes lives in one ``Runtime`` (``runtime.py``), and a new one
(``install``) is a fresh process's: no other module-level state, settings read once."""

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
from miles_nemogym import agent, groups, metrics
from miles_nemogym.runtime import Runtime, current, install
from miles_nemogym.settings import Settings
from tests.support.circuits import held_count, is_open, waiting_episodes
from tests.support.fault_server import FaultServer
from tests.support.ports import free_port
from tests.support.samples import Sample

PACKAGE = Path(miles_nemogym.__file__).parent

# Process-wide mutable objects outside the Runtime: the holder of the process's Runtime, and a
# process's own resources that are not state of a run (serve's live servers, the loop pools).
DECLARED = {
    "miles_nemogym.runtime._process",  # the process's one Runtime
    "miles_nemogym.transport._pools",  # per event loop, closed with it (transport.close_pools)
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


def test_process_wide_state_lives_in_the_runtime_or_is_declared() -> None:
    found = set()
    for module in _modules():
        for name, value in vars(module).items():
            if name.startswith("__"):
                continue
            if getattr(value, "__module__", None) != module.__name__ and not _mutable(value):
                continue
            if _mutable(value) and not isinstance(value, (type, tuple, frozenset)):
                found.add(f"{module.__name__}.{name}")
        source = ast.parse(Path(module.__file__).read_text())
        for node in ast.walk(source):
            if isinstance(node, ast.Global):
                found.update(f"{module.__name__}.{name}" for name in node.names)
    assert found == DECLARED
    fresh = Runtime()
    assert {name for name, value in vars(fresh).items() if _mutable(value) or isinstance(value, dict)} == {
        "ledger",
        "circuits",
        "in_flight",
        "held",
        "stores",
        "reward_problems",
        "logged",
        "addresses",
    }


@pytest.mark.usefixtures("clean_env")  # on the environment: its point is that a runtime reads it once
async def test_a_new_runtime_is_a_fresh_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sympy_row: dict[str, Any], sympy_result: dict[str, Any]
) -> None:
    monkeypatch.setenv("NEMO_GYM_EPISODE_DIR", str(tmp_path / "episodes"))
    monkeypatch.setenv("NEMO_GYM_OUTAGE_TIMEOUT", "0.3")
    server = await FaultServer(result=sympy_result, mode="500").start()
    try:
        monkeypatch.setenv("NEMO_GYM_URL", server.url)
        groups.check_episode_group(None, [])  # no salvage hook wired: warned once
        failed = await agent.run(base_url="http://127.0.0.1:1/sessions/a", metadata=sympy_row)
    finally:
        await server.stop()
    old = current()
    # Read once: a variable changed after the first hook call does not reach this runtime.
    monkeypatch.setenv("NEMO_GYM_URL", f"http://127.0.0.1:{free_port()}")  # down: its circuit gives up
    assert old.settings.gym_url == server.url
    install(Runtime(Settings.from_env()))
    down = await agent.run(base_url="http://0.0.0.0:1/sessions/b", metadata=sympy_row)
    assert failed["nemogym"]["mask_sample"] and down["nemogym"]["failure_kind"] == "transport_unreachable"
    await agent.reward_func(None, Sample(metadata={"reward": None}))
    used = current()
    stored = used.stores.get(str(tmp_path / "episodes"))
    assert used.ledger.streak()[0] == 1 and groups.stop_reason(used.settings) is not None
    assert held_count(used.held) == 1 and used.reward_problems and len(used.addresses) == 1
    assert not old.logged.log(metrics.logger, 10, "salvage not wired", "x")  # already logged by the filter
    assert held_count(old.held) == 1 and old.ledger.streak()[0] == 1  # the first runtime kept its own

    install()

    fresh = current()
    assert fresh is not used and groups.stop_reason(fresh.settings) is None
    assert not is_open(fresh.circuits) and waiting_episodes(fresh.circuits) == 0
    assert fresh.ledger.streak() == (0, {}, {}) and fresh.ledger.drain().episodes == 0
    assert held_count(fresh.held) == 0 and not fresh.reward_problems and fresh.addresses == {}
    assert fresh.stores.get(str(tmp_path / "episodes")) is not stored  # the old one was closed
    assert fresh.logged.log(metrics.logger, 10, "salvage not wired", "x")  # logged again, once


# Caches of a pure function of their arguments and the pinned files: never stale, never reset.
PURE_CACHES = {
    "miles_nemogym.groups._output_type",  # an import
    "miles_nemogym.groups._miles_post_process",  # an import
    "miles_nemogym.gym.wheel._archive",  # keyed by the wheel's path, mtime and size
    "miles_nemogym.gym.wheel._members",  # keyed by the wheel's path, mtime and size
    "miles_nemogym.gym.composition._member",  # a member of the pinned wheel
    "miles_nemogym.gym.environments.catalog_folders",  # keyed by the wheel's path
    "miles_nemogym.gym.environments.folder_servers",  # keyed by the wheel's path
    "miles_nemogym.gym.environments.benchmark_environments",  # keyed by the wheel's path
    "miles_nemogym.gym.environments._server_configs",  # keyed by the wheel's path
    "miles_nemogym.gym.environments._agent_configs_of",  # keyed by the wheel's path
    "miles_nemogym.gym.environments.config_names",  # keyed by the wheel's path
    "miles_nemogym.gym.environments.shipped_environments",  # keyed by the wheel's path
    "miles_nemogym.gym.environments.refused_folders",  # keyed by the wheel's path
    "miles_nemogym.errors.key_scrubber",  # keyed by the secret
}
# Read once per process, as a process reads its environment: the system's CA certificates
# (~25 ms of CPU a load; a Runtime per test would load them for every test).
PROCESS_CACHES = {"miles_nemogym.transport.trust_store"}


def test_every_module_cache_is_pure() -> None:
    """What the host or network says (the routed local address) is kept by the Runtime, never a module cache."""
    caches = {
        f"{module.__name__}.{name}"
        for module in _modules()
        for name, value in vars(module).items()
        if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", None) == module.__name__
    }
    assert caches == PURE_CACHES | PROCESS_CACHES


def test_a_new_runtime_asks_again_which_local_address_routes_to_the_gym_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from miles_nemogym.episode.run import policy_base_url

    session = "http://0.0.0.0:30000/sessions/abc"
    asked = "session server listens on a wildcard address"
    with caplog.at_level("INFO"):
        url = policy_base_url(session, "http://localhost:12000", None, current().addresses)
        assert url == "http://127.0.0.1:30000/sessions/abc/v1"
        caplog.clear()
        policy_base_url(session, "http://localhost:12000", None, current().addresses)
        assert asked not in caplog.text  # kept by this runtime
        install()
        policy_base_url(session, "http://localhost:12000", None, current().addresses)
    assert asked in caplog.text  # the address was routed again, not taken from a stale cache
