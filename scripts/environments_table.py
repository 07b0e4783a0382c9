#!/usr/bin/env python3
"""Which of nemo-gym's shipped resources servers ``serve --env`` runs here, which need what,
and which it refuses and why: README's summary table and docs/environments.md's table of
every server, generated from the pinned wheel (no server venv).

    python scripts/environments_table.py readme   # the block README.md carries between its markers
    python scripts/environments_table.py docs     # the block of docs/environments.md

The reading is ``tests/support/environments_table.py``; ``tests/test_environments_table.py``
checks both files against it, ``tests/integration/test_serve_judges.py`` that nemo-gym's
parser agrees. Runs from a checkout: its ``src/`` and ``tests/`` are put on the path.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.support.environments_table import docs, readme, rows  # noqa: E402


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "readme"
    if which not in ("readme", "docs"):
        raise SystemExit("usage: environments_table.py [readme|docs]")
    print((readme if which == "readme" else docs)(rows()), end="")


if __name__ == "__main__":
    main()
