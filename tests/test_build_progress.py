"""An environment build shows counts, not pip's raw lines cut to fit: n of m requirements
collected, then how many packages are installed; the step and its count each on one line."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

from miles_nemogym.cli._console import step_display
from miles_nemogym.gym.venv import BuildLines, run_build_step

# What pip 24 prints into a pipe while installing (lines as in a real server-environment build log).
PIP_OUTPUT = """\
Collecting openai==2.44.0
  Downloading openai-2.44.0-py3-none-any.whl (1.4 MB)
Collecting anthropic<=0.109.2
  Using cached anthropic-0.109.2-py3-none-any.whl (923 kB)
Collecting pydantic<3,>=2 (from openai==2.44.0)
  Downloading https://files.example/packages/pydantic-2.11.0-py3-none-any.whl (444 kB)
Collecting PyYAML
WARNING: something pip wanted to say
Installing collected packages: pyyaml, pydantic, anthropic, openai
Successfully installed PyYAML-6.0 anthropic-0.109.2 openai-2.44.0 pydantic-2.11.0
"""


def test_pip_output_becomes_counts_of_the_named_requirements(tmp_path: Path) -> None:
    fake_pip = tmp_path / "pip.py"
    fake_pip.write_text(f"import sys\nsys.stdout.write({PIP_OUTPUT!r})\n")
    shown: list[str] = []
    command = [sys.executable, str(fake_pip), "install", "--no-input", "openai==2.44.0", "anthropic<=0.109.2", "pyyaml"]

    run_build_step(command, shown.append, "pip install", log_path=tmp_path / "build.log")

    details = [line.strip() for line in shown]
    assert details[0] == "1 of 3 requirements collected, 1 packages in all: openai"
    assert (
        details[1]
        == "1 of 3 requirements collected, 1 packages in all: downloading openai-2.44.0-py3-none-any.whl (1.4 MB)"
    )
    assert (
        "2 of 3 requirements collected, 3 packages in all: downloading pydantic-2.11.0-py3-none-any.whl (444 kB)"
        in details
    )
    assert "2 of 3 requirements collected, 3 packages in all: pydantic" in details  # pydantic is not named
    assert "3 of 3 requirements collected, 4 packages in all: pyyaml" in details
    assert "something pip wanted to say" not in " ".join(details)  # the count stays on screen
    assert details[-2:] == [
        "installing 4 packages (pip shows no per-package progress here)",
        "installed 4 packages",
    ]
    assert (tmp_path / "build.log").read_text().count("Collecting") == 4  # the full output is kept


def test_a_command_that_is_not_pip_shows_its_own_lines(tmp_path: Path) -> None:
    shown: list[str] = []
    run_build_step(
        [sys.executable, "-c", "print('Cloning into staging...')"], shown.append, "git", log_path=tmp_path / "l"
    )
    assert shown == ["  Cloning into staging..."]


@pytest.mark.parametrize("width", [80, 120])
def test_the_step_and_its_count_each_fit_a_line(width: int) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=True, color_system=None)
    step = "installing 40 requirements of nemo-gym 0.7.0 (takes minutes)"
    count = "12 of 40 requirements collected, 57 packages in all: numpy"
    with step_display(console) as progress:
        progress(step)
        progress("  " + count)
    lines = [line.rstrip() for line in re.split(r"[\r\n]", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buffer.getvalue()))]
    assert all(len(line) <= width for line in lines)
    assert any(step in line for line in lines) and any(line.strip() == count for line in lines)
    assert "…" not in buffer.getvalue()


def test_without_a_live_line_counts_are_printed_now_and_then_and_the_install_always() -> None:
    stream = io.StringIO()
    printer = BuildLines("miles-env", stream, every_s=3600)
    printer("installing 12 Miles rollout requirements (takes minutes cold)")
    for number in range(1, 50):
        printer(f"  {min(number, 12)} of 12 requirements collected, {number} packages in all: pkg{number}")
    printer("  installing 49 packages (pip shows no per-package progress here)")
    printer("  installed 49 packages")
    assert stream.getvalue().splitlines() == [
        "[miles-env] installing 12 Miles rollout requirements (takes minutes cold)",
        "[miles-env]   1 of 12 requirements collected, 1 packages in all: pkg1",  # then quiet for every_s
        "[miles-env]   installing 49 packages (pip shows no per-package progress here)",
        "[miles-env]   installed 49 packages",
    ]
    every = io.StringIO()
    chatty = BuildLines("gym-venv", every, every_s=0)
    for number in range(3):
        chatty(f"  {number} of 3 requirements collected, {number} packages in all: p")
    assert len(every.getvalue().splitlines()) == 3
