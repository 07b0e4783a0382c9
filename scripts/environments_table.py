#!/usr/bin/env python3
"""What this package does with each entry of NeMo-Gym's catalog: README's summary of the
resources servers ``serve --env`` runs, needs or refuses (read from the pinned wheel) and
docs/environments.md's table of every catalog entry (read by nemo-gym's registry in the server
venv, built first if needed).

    python scripts/environments_table.py readme   # the block README.md carries between its markers
    python scripts/environments_table.py docs     # the block of docs/environments.md

The reading is ``tests/support/environments_table.py``; ``tests/test_environments_table.py``
checks README, ``tests/integration/test_environments_cli.py`` the docs table, and
``tests/integration/test_serve_judges.py`` that nemo-gym's parser agrees. Runs from a
checkout: its ``src/`` and ``tests/`` are put on the path.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from miles_nemogym.gym.catalog import load_catalog  # noqa: E402
from miles_nemogym.gym.venv import ensure_gym_venv  # noqa: E402
from tests.support.environments_table import docs, readme, rows  # noqa: E402


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "readme"
    if which not in ("readme", "docs"):
        raise SystemExit("usage: environments_table.py [readme|docs]")
    print(readme(rows()) if which == "readme" else docs(load_catalog(ensure_gym_venv())), end="")


if __name__ == "__main__":
    main()
