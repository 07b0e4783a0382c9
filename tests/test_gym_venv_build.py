"""The server venv build's output handling, and the interpreter check on a cached venv."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from miles_nemogym.gym import venv as gym_venv


def _ready_cache(root: Path, built_with: str) -> Path:
    link = root / "gym-venv" / gym_venv.venv_key("local")
    site = link / "lib" / "site-packages"
    (site / gym_venv.AGENT_RELATIVE_DIR).mkdir(parents=True)
    (site / gym_venv.AGENT_RELATIVE_DIR / "app.py").write_text("")
    (link / "bin").mkdir()
    (link / "bin" / "python").write_text("")
    (link / gym_venv.READY_MARKER).write_text(json.dumps({"site_packages": "lib/site-packages", "python": built_with}))
    return link


def test_run_keeps_the_full_output_in_its_log_and_passes_details_indented(tmp_path: Path) -> None:
    lines: list[str] = []
    log = tmp_path / "build.log"
    script = "import sys\nfor i in range(100): print(f'Collecting pkg{i}')\nsys.exit(3)"
    with pytest.raises(gym_venv.GymVenvBuildError) as caught:
        gym_venv._run([sys.executable, "-c", script], lines.append, "pip install of things", log_path=log)
    message = str(caught.value)
    assert message.startswith(f"pip install of things failed (exit 3); full log: {log}\nlast lines:\n")
    assert message.splitlines()[-1] == "Collecting pkg99"
    assert "Collecting pkg69" not in message  # only the tail
    assert lines == [f"  Collecting pkg{i}" for i in range(100)]
    text = log.read_text()
    assert "Collecting pkg0\n" in text and "Collecting pkg99\n" in text and text.endswith("[exit 3]\n")


def test_run_without_a_log_path_still_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(tmp_path))
    gym_venv._run([sys.executable, "-c", "print('hello')"], lambda line: None, "python -m venv")
    assert "hello\n" in (tmp_path / "logs" / "python-m-venv.log").read_text()


def test_a_wrong_interpreter_variable_is_refused_even_with_a_cached_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(tmp_path))
    _ready_cache(tmp_path, "/opt/python3.13/bin/python3.13")
    wrong = tmp_path / "python"
    wrong.write_text("#!/bin/sh\necho 3.11\n")
    wrong.chmod(wrong.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(gym_venv.GYM_PYTHON_ENV, str(wrong))
    with pytest.raises(
        gym_venv.GymPythonNotFoundError, match=r"MILES_NEMOGYM_GYM_PYTHON=.* is Python 3\.11, not 3\.13"
    ):
        gym_venv.ensure_gym_venv("local", progress=lambda line: None)


def test_a_cached_venv_says_which_interpreter_built_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(tmp_path))
    monkeypatch.delenv(gym_venv.GYM_PYTHON_ENV, raising=False)
    link = _ready_cache(tmp_path, "/opt/python3.13/bin/python3.13")
    lines: list[str] = []
    ready = gym_venv.ensure_gym_venv("local", progress=lines.append)
    assert ready.built_with == "/opt/python3.13/bin/python3.13"
    assert lines == [f"using the cached NeMo-Gym server environment {link} (Python: /opt/python3.13/bin/python3.13)"]
