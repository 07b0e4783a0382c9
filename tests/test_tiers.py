"""The test tiers README's development section names: `-m "not integration"` leaves the slow tiers out,
a plain run or an `-m` naming a tier keeps it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tiers import left_out, workers

ROOT = Path(__file__).resolve().parents[1]
SLOW_FILES = ("tests/test_quality.py", "tests/test_launcher_ray.py", "tests/test_bench_smoke.py")


@pytest.mark.parametrize(
    ("markexpr", "marks", "expected"),
    [
        ("", {"lint"}, False),  # a plain run: every tier
        ("not integration", {"lint"}, True),
        ("not integration", {"ray", "timeout"}, True),
        ("not integration", {"bench"}, True),
        ("not integration", {"asyncio"}, False),  # an ordinary unit test
        ("lint", {"lint"}, False),
        ("not integration or lint", {"lint"}, False),
        ("not integration or lint", {"ray"}, True),
        ("integration", {"integration"}, False),  # the integration tier is selected by -m as usual
    ],
)
def test_a_slow_tier_runs_only_when_the_run_names_it(markexpr: str, marks: set[str], expected: bool) -> None:
    assert left_out(markexpr, marks) is expected


def test_the_unit_tier_collects_no_slow_test() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not integration",
         *SLOW_FILES],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert "no tests collected" in done.stdout, done.stdout[-2000:]
    assert "deselected" in done.stdout  # the files were read, and every test in them left out


@pytest.mark.parametrize(
    ("markexpr", "cores", "expected"),
    [
        ("not integration", 2, 2),  # the unit tier: one worker per core
        ("not integration or lint", 16, 4),  # at most UNIT_WORKERS
        ("not integration", 1, 0),  # one core: no worker processes
        ("not integration", None, 0),
        ("", 8, 0),  # the full run: one process, the integration tests alone on the machine
        ("integration", 8, 0),
        ("lint", 8, 0),
        ("integration or not integration", 8, 0),
    ],
)
def test_only_a_run_without_integration_tests_gets_workers(markexpr: str, cores: int | None, expected: int) -> None:
    assert workers(markexpr, cores) == expected
