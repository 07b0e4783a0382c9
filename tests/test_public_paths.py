"""Every dotted path the documents name and the launcher passes to Miles resolves the way Miles loads it.

Miles ``miles/utils/misc.py`` (radixark/miles 31f1ca9): ``load_function(path)`` is
``importlib.import_module(module)`` + ``getattr``; ``call_agent_abort_hook`` loads
``<agent module>.abort`` beside ``--custom-agent-function-path`` and silently skips a
missing one. The paths are parsed from README.md, docs/ and the launcher's ``--dry-run``
command, so a path added to any of them is covered without editing this test.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.launcher_script import run_launcher

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]

_PATH = r"miles_nemogym(?:\.\w+)+"
_FLAG_PATH = re.compile(rf"(--[a-z][a-z-]*-path)\s+({_PATH})")
_IMPORT = re.compile(r"^from (miles_nemogym(?:\.\w+)*) import ([\w, ]+)$", re.MULTILINE)
AGENT_FLAG = "--custom-agent-function-path"
AWAITED_FLAGS = frozenset({AGENT_FLAG, "--custom-rm-path"})
"""Flags whose function Miles awaits (``agentic_tool_call.py``, ``rm_hub/__init__.py``)."""


def load_function(path: str) -> Any:
    """Miles' ``load_function`` at 31f1ca9, without its registry (our paths are never registered)."""
    module_path, _, attr = path.rpartition(".")
    module = importlib.import_module(module_path)
    return getattr(module, attr)


def resolve(path: str) -> Any:
    """A documented module, or a module's attribute as Miles loads it."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as error:
        if error.name != path:  # the module exists but one of its imports is missing
            raise
    return load_function(path)


def documented_paths() -> set[str]:
    text = "\n".join(doc.read_text(encoding="utf-8") for doc in DOCUMENTS)
    paths = {match.rstrip(".") for match in re.findall(_PATH, text)}
    for module, names in _IMPORT.findall(text):
        paths |= {f"{module}.{name.strip()}" for name in names.split(",") if name.strip()}
    return paths


def flag_paths(text: str) -> set[tuple[str, str]]:
    return {(flag, path) for flag, path in _FLAG_PATH.findall(text)}


@pytest.fixture(scope="module")
def dry_run_command() -> str:
    done = run_launcher("--dry-run", "--miles-root", str(ROOT / "no-miles-here"))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_path_the_documents_name_resolves() -> None:
    paths = documented_paths()
    assert {"miles_nemogym.agent.run", "miles_nemogym.data.convert_row", "miles_nemogym.checks.run"} <= paths
    unresolved = []
    for path in sorted(paths):
        try:
            resolve(path)
        except (ImportError, AttributeError) as error:
            unresolved.append(f"{path}: {type(error).__name__}: {error}")
    assert unresolved == []


def test_the_launcher_passes_every_hook_readme_lists(dry_run_command: str) -> None:
    launched = flag_paths(dry_run_command)
    assert dict(launched) == {
        "--custom-agent-function-path": "miles_nemogym.agent.run",
        "--custom-rm-path": "miles_nemogym.agent.reward_func",
        "--dynamic-sampling-filter-path": "miles_nemogym.groups.check_episode_group",
        "--custom-rollout-log-function-path": "miles_nemogym.metrics.log_rollout",
        "--custom-eval-rollout-log-function-path": "miles_nemogym.metrics.log_eval",
        "--custom-reward-post-process-path": "miles_nemogym.groups.reward_post_process",
    }
    assert launched <= flag_paths(README.read_text(encoding="utf-8"))


def test_every_hook_loads_as_miles_loads_it(dry_run_command: str) -> None:
    hooks = flag_paths(dry_run_command) | flag_paths(README.read_text(encoding="utf-8"))
    for flag, path in sorted(hooks):
        function = load_function(path)
        assert callable(function), path
        assert inspect.iscoroutinefunction(function) == (flag in AWAITED_FLAGS), f"{flag} {path}"


def test_the_agent_abort_hook_is_found_beside_every_agent_function(dry_run_command: str) -> None:
    agents = {path for flag, path in flag_paths(dry_run_command) if flag == AGENT_FLAG}
    agents |= {path for flag, path in flag_paths(README.read_text(encoding="utf-8")) if flag == AGENT_FLAG}
    assert agents == {"miles_nemogym.agent.run"}
    for path in agents:
        module_path, _, _ = path.rpartition(".")
        abort = load_function(f"{module_path}.abort")  # call_agent_abort_hook's lookup
        assert inspect.iscoroutinefunction(abort)
        assert list(inspect.signature(abort).parameters) == ["args"]  # awaited as abort_hook(args)


def test_a_moved_path_fails_resolution() -> None:
    with pytest.raises(AttributeError):
        resolve("miles_nemogym.agent.run_moved")
    with pytest.raises(ModuleNotFoundError):
        resolve("miles_nemogym.no_such_module.run")
