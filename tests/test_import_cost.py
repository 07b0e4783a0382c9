"""Importing the hooks must not pull in heavy or trainer-only packages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN = ("torch", "sglang", "ray", "datasets", "miles", "pyarrow", "httpx", "typer", "rich")


@pytest.mark.parametrize(
    "module", ["miles_nemogym.agent", "miles_nemogym.reward", "miles_nemogym.filters", "miles_nemogym.metrics"]
)
def test_hook_import_is_light(module: str) -> None:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {name.split(".")[0] for name in json.loads(done.stdout)}
    assert not loaded & set(FORBIDDEN), f"{module} imported {sorted(loaded & set(FORBIDDEN))}"
