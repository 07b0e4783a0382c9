#!/usr/bin/env python3
"""Golden (or API-policy) scan of a NeMo-Gym server, runnable as a file.

    python scripts/golden_scan.py --input data/verified.jsonl --golden --output golden.jsonl

The same command and code as ``miles-nemogym scan`` (``miles_nemogym.cli.main``'s ``scan``); run
``python scripts/golden_scan.py --help`` for the flags and exit codes. Works from a
checkout without installing the package (its ``src/`` is put on the path), as long as
the package's dependencies are installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from miles_nemogym.cli.main import app
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from miles_nemogym.cli.main import app

if __name__ == "__main__":
    app(["scan", *sys.argv[1:]], prog_name="golden_scan.py")
