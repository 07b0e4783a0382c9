"""README's quick start, run exactly as written: a fresh virtual environment, the repository as
the working folder, and each command of the ```bash block in turn."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.readme import README, section_commands

pytestmark = pytest.mark.integration


def test_readme_quick_start_is_two_commands() -> None:
    assert section_commands("Quick start") == ["pip install -e '.[cli]'", "miles-nemogym smoke"]


def test_readme_quick_start_works_in_a_fresh_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update({"VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"})
    # The store (README: --episode-dir, else NEMO_GYM_EPISODE_DIR, else ./miles-nemogym-smoke-episodes)
    # goes to a short folder of the test's, not into the checkout (the closing hint quotes the path).
    store = Path(tempfile.mkdtemp(prefix="qs-")) / "episodes"
    env["NEMO_GYM_EPISODE_DIR"] = str(store)
    outputs = []
    for command in section_commands("Quick start"):
        done = subprocess.run(
            ["bash", "-c", command], cwd=README.parent, env=env, capture_output=True, text=True, timeout=1200
        )
        assert done.returncode == 0, (
            f"{command!r} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        outputs.append(done.stdout)
    smoke = outputs[-1]
    assert "smoke: one row per episode" in smoke
    assert "scikit-learn__scikit-learn-14141" in smoke
    assert max(len(line) for line in smoke.splitlines()) <= 80
    assert any((store / "train").iterdir())  # the store the closing hint names
    shutil.rmtree(store.parent)
