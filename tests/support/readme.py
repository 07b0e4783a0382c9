"""Read command blocks out of README.md, so tests run exactly what it tells users to type."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def section_commands(heading: str, readme: Path = README) -> list[str]:
    """The lines of the first ```bash block under the ``## heading`` that starts with ``heading``."""
    text = readme.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    match = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    if match is None:
        raise AssertionError(f"README section {heading!r} has no ```bash block")
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]
