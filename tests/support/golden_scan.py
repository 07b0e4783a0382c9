"""A golden scan as a blocking call, for tests that read its ``ScanResult`` rather than its output."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console

from miles_nemogym.scan._config import ScanConfig
from miles_nemogym.scan._results import ResultLine, ResultsLock, Verdict
from miles_nemogym.scan._runner import ScanResult, run_scan


def golden_scan(
    input_path: Path,
    gym_url: str,
    *,
    output_path: Path | None = None,
    concurrency: int = 4,
    console: Console | None = None,
) -> ScanResult:
    """Scan ``input_path`` against ``gym_url`` with the gold patches (``.exit_code``, ``.results``)."""
    config = ScanConfig(
        input_path=input_path, gym_url=gym_url, golden=True, output_path=output_path, concurrency=concurrency
    )
    return asyncio.run(run_scan(config, console=console))


def not_passed(result: ScanResult) -> list[ResultLine]:
    """The results of ``result`` whose verdict is not ``passed``."""
    return [line for line in result.results if line.verdict is not Verdict.passed]


def read_results(path: Path) -> dict[str, ResultLine]:
    """The results file's lines by instance id, read as a scan reads it (under its lock)."""
    lock = ResultsLock(path)
    try:
        return lock.read()
    finally:
        lock.release()
