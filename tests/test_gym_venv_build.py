"""The server venv build's output handling, the interpreter check on a cached venv, and the patch."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import stat
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from miles_nemogym.gym import venv as gym_venv
from miles_nemogym.gym import wheel as gym_wheel


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
        gym_venv.run_build_step([sys.executable, "-c", script], lines.append, "pip install of things", log_path=log)
    message = str(caught.value)
    assert message.startswith(f"pip install of things failed (exit 3); full log: {log}\nlast lines:\n")
    assert message.splitlines()[-1] == "Collecting pkg99"
    assert "Collecting pkg69" not in message  # only the tail
    assert lines == [f"  Collecting pkg{i}" for i in range(100)]
    text = log.read_text()
    assert "Collecting pkg0\n" in text and "Collecting pkg99\n" in text and text.endswith("[exit 3]\n")


def test_run_without_a_log_path_still_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(tmp_path))
    gym_venv.run_build_step([sys.executable, "-c", "print('hello')"], lambda line: None, "python -m venv")
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


# ----------------------------------------------------------------------------- the patch


def _installed_app(site: Path, text: str) -> Path:
    app = site / gym_venv.PATCHED_FILE
    app.parent.mkdir(parents=True)
    app.write_text(text, encoding="utf-8")
    return app


def _wheel_app() -> str:
    return gym_wheel.read_member(gym_venv.PATCHED_FILE.as_posix()).decode("utf-8")


def _config_write_block(patched: str) -> str:
    """The lines the patch put in, dedented, as a statement block."""
    lines = patched.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if "One file per distinct config" in line)
    end = next(i for i, line in enumerate(lines) if "os.replace(staged_path, config_path)" in line)
    return textwrap.dedent("".join(lines[start : end + 1]))


def _upstream_md_diff() -> str:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "upstream.md").read_text()
    section = doc.split("## Patched: nemo-gym's per-instance config file", 1)[1]
    return section.split("```diff\n", 1)[1].split("```", 1)[0]


def test_the_patch_replaces_only_the_config_write_of_the_pinned_wheel(tmp_path: Path) -> None:
    original = _wheel_app()
    app = _installed_app(tmp_path, original)
    gym_venv.patch_gym(tmp_path)
    patched = app.read_text(encoding="utf-8")
    name = gym_venv.PATCHED_FILE.as_posix()
    made = list(difflib.unified_diff(original.splitlines(True), patched.splitlines(True), f"a/{name}", f"b/{name}"))
    # One hunk, and it is the upstream-ready diff docs/upstream.md shows.
    assert [line for line in made if line.startswith("@@")] == ["@@ -851,8 +851,14 @@\n"]
    assert "".join(made) == _upstream_md_diff()
    assert [line[1:].strip() for line in made[2:] if line.startswith("-")] == [
        'config_path = config_output_dir / f"{instance_id}.sandbox.yaml"',
        "config_path.write_text(yaml.safe_dump(config, sort_keys=False))",
    ]
    assert sorted(p.name for p in app.parent.iterdir()) == ["app.py"]  # nothing staged left beside it


def test_the_patched_write_gives_each_config_its_own_file_written_whole(tmp_path: Path) -> None:
    app = _installed_app(tmp_path / "site", _wheel_app())
    gym_venv.patch_gym(tmp_path / "site")
    block = compile(_config_write_block(app.read_text(encoding="utf-8")), "patched", "exec")
    out = tmp_path / "_configs"
    out.mkdir()

    def write(config: dict[str, Any]) -> Path:
        scope: dict[str, Any] = {"yaml": yaml, "hashlib": hashlib, "os": os, "uuid4": uuid.uuid4}
        scope.update(config=config, instance_id="sympy__sympy-20916", config_output_dir=out)
        exec(block, scope)  # the patched lines as the server runs them
        path: Path = scope["config_path"]
        return path

    seed_1 = {"model": {"model_kwargs": {"temperature": 0.7, "extra_body": {"seed": 1}}}}
    seed_2 = {"model": {"model_kwargs": {"temperature": 0.7, "extra_body": {"seed": 2}}}}
    first, again, second = write(seed_1), write(seed_1), write(seed_2)
    assert first == again != second  # one file per distinct config, whatever the request
    assert yaml.safe_load(first.read_text()) == seed_1 and yaml.safe_load(second.read_text()) == seed_2
    assert sorted(p.name for p in out.iterdir()) == sorted({first.name, second.name})  # no staged leftovers
    assert all(p.name.startswith("sympy__sympy-20916.") and p.name.endswith(".sandbox.yaml") for p in out.iterdir())


def _patched_wheel_app() -> str:
    return _wheel_app().replace(
        "config_path.write_text(yaml.safe_dump(config, sort_keys=False))\n",
        "config_path.write_text(yaml.safe_dump(config, sort_keys=False))  # fixed upstream\n",
    )


@pytest.mark.parametrize(
    "installed",
    [
        pytest.param(_patched_wheel_app, id="another-version"),
        pytest.param(lambda: _wheel_app() * 2, id="twice"),
    ],
)
def test_a_nemo_gym_without_the_expected_code_is_refused_and_left_as_is(
    tmp_path: Path, installed: Callable[[], str]
) -> None:
    text = installed()
    app = _installed_app(tmp_path, text)
    with pytest.raises(gym_venv.GymVenvBuildError, match=r"does not hold the config write .* nemo-gym 0\.7\.0") as e:
        gym_venv.patch_gym(tmp_path)
    assert str(app) in str(e.value)
    assert app.read_text(encoding="utf-8") == text


def test_a_patched_nemo_gym_is_not_patched_twice(tmp_path: Path) -> None:
    app = _installed_app(tmp_path, _wheel_app())
    gym_venv.patch_gym(tmp_path)
    once = app.read_text(encoding="utf-8")
    with pytest.raises(gym_venv.GymVenvBuildError, match="found 0 times, expected once"):
        gym_venv.patch_gym(tmp_path)
    assert app.read_text(encoding="utf-8") == once
