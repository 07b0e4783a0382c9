"""Importing the hooks must not pull in heavy or trainer-only packages; no module imports another's private names."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

FORBIDDEN = ("torch", "sglang", "ray", "datasets", "miles", "pyarrow", "httpx", "typer", "rich")


@pytest.mark.parametrize(
    "module", ["miles_nemogym.agent", "miles_nemogym.groups", "miles_nemogym.buffer", "miles_nemogym.metrics"]
)
def test_hook_import_is_light(module: str) -> None:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {name.split(".")[0] for name in json.loads(done.stdout)}
    assert not loaded & set(FORBIDDEN), f"{module} imported {sorted(loaded & set(FORBIDDEN))}"


def test_no_module_imports_another_modules_private_names() -> None:
    """A module's public names are its API: what another module needs is made public, named for what it is."""
    package = Path(__file__).resolve().parents[1] / "src" / "miles_nemogym"
    crossings = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("miles_nemogym"):
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                crossings += [f"{path.relative_to(package)}: {node.module}.{name}" for name in private]
    assert crossings == []


def test_the_command_line_defers_what_only_some_commands_need() -> None:
    """Every ``miles-nemogym`` command imports ``cli.main``: the YAML parser, serve's composition
    and the episode views load only in the commands that use them."""
    code = "import sys, json, miles_nemogym.cli.main; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    deferred = {"yaml", "miles_nemogym.gym.composition", "miles_nemogym.store.views"}
    assert not set(json.loads(done.stdout)) & deferred
