"""Golden and API-policy scans: check a NeMo-Gym server before any GPU time is spent.

A scan runs SWE-bench instances through the server with exactly the request builder,
client and classification the Miles agent function uses, and reports per instance and
per repo. Golden mode (server with ``run_golden: true``) expects every reward to be
1.0; API-policy mode (``policy_base_url``) drives whole episodes with a real model.

Public API:

- ``ScanConfig``: the scan's parameters (the CLI flags);
- ``run_scan(config, console=..., stop=...) -> ScanResult`` (async): run it, print
  progress and summary; ``ScanUsageError`` before any episode when it cannot start;
- ``execute(config) -> int``: the same as a program (signals, exit code) — what
  ``miles-nemogym scan`` and ``scripts/golden_scan.py`` call;
- ``golden_scan(input_path, gym_url, ...) -> ScanResult``: a golden scan from plain code.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console

from miles_nemogym.scan.config import ScanConfig
from miles_nemogym.scan.entry import execute
from miles_nemogym.scan.results import ResultLine, read_results
from miles_nemogym.scan.runner import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ScanResult,
    ScanUsageError,
    run_scan,
)
from miles_nemogym.scan.verdict import Verdict


def golden_scan(
    input_path: Path,
    gym_url: str,
    *,
    output_path: Path | None = None,
    concurrency: int = 4,
    timeout_s: float | None = None,
    limit: int | None = None,
    console: Console | None = None,
) -> ScanResult:
    """Run a golden scan of ``input_path`` against ``gym_url`` and return its result
    (``.exit_code``, ``.results``, ``.not_passed`` with each reason). Blocking."""
    config = ScanConfig(
        input_path=input_path,
        gym_url=gym_url,
        golden=True,
        output_path=output_path,
        concurrency=concurrency,
        timeout_s=timeout_s,
        limit=limit,
    )
    return asyncio.run(run_scan(config, console=console))


__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "ResultLine",
    "ScanConfig",
    "ScanResult",
    "ScanUsageError",
    "Verdict",
    "execute",
    "golden_scan",
    "read_results",
    "run_scan",
]
