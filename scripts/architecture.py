#!/usr/bin/env python3
"""The package's shape, measured from its source: docs/architecture.md's "The package measured".

    python scripts/architecture.py     # Markdown: the figures table and the rooms' import arrows

Reads ``src/`` with ``ast`` (nothing is imported); the measurement is
``tests/support/architecture.py``, and ``tests/test_architecture.py`` checks the doc against it.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from tests.support.architecture import markdown, measure  # noqa: E402

if __name__ == "__main__":
    print(markdown(measure(ROOT)), end="")
