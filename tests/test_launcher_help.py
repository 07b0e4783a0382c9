"""The launcher's --help: every flag described and grouped, plain text, the full precedence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from miles_nemogym.launcher._config import LauncherConfig
from miles_nemogym.launcher.run import GROUPS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def test_every_field_is_in_exactly_one_group() -> None:
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(LauncherConfig.model_fields)
    assert list(GROUPS) == ["run", "model", "data", "rollout", "fully async", "training", "cluster", "eval", "NeMo-Gym"]


def test_every_flag_has_a_description_and_sits_in_its_group() -> None:
    parser = build_parser()
    titles = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            titles[action.dest] = group.title
            assert action.help and action.help.strip(), f"{action.option_strings} has no description"
    for title, names in GROUPS.items():
        for name in names:
            assert titles[name] == title


def test_help_is_plain_text_with_the_whole_precedence() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "swebench_grpo" / "run.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    text = done.stdout
    assert "``" not in text
    assert (
        "defaults < environment (NEMO_GYM_URL, NEMO_GYM_ENVS, MILES_ROUTER_EXTERNAL_HOST, RAY_ADDRESS, MASTER_ADDR) "
        "< --config YAML < flags" in " ".join(text.split())
    )
    for title in GROUPS:
        assert f"\n{title}:\n" in text
    assert "--nemo-gym-url VALUE  Base URL of the NeMo-Gym mini_swe_agent_2 server" in text


def test_dry_run_without_miles_says_so_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dry-run"]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert text.count("not importable") == 1
    assert "# Miles not usable here (the 'miles' package is not importable)" in text
