"""Golden and API-policy scans: check a NeMo-Gym server before any GPU time is spent."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console

from miles_nemogym.scan._config import ScanConfig
from miles_nemogym.scan._entry import execute
from miles_nemogym.scan._runner import ScanResult, run_scan


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


__all__ = ["ScanConfig", "execute", "golden_scan"]
