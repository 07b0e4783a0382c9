"""Read command blocks out of README.md, so tests run exactly what it tells users to type."""

from __future__ import annotations

import re
import shlex
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


ENVIRONMENTS_DOC = README.parent / "docs" / "environments.md"


def bash_commands(doc: Path) -> list[tuple[str, list[str]]]:
    """Every command of every ```bash block of ``doc``, in order: (``<file>:<line>``, its words as
    the shell splits them: continuation lines joined, comments dropped)."""
    commands: list[tuple[str, list[str]]] = []
    lines = doc.read_text(encoding="utf-8").splitlines()
    inside, pending, start = False, "", 0
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            inside = line == "```bash"
            continue
        if not inside:
            continue
        if not pending:
            start = number
        pending += line.removesuffix("\\") + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        words = shlex.split(pending, comments=True)
        if words:
            commands.append((f"{doc.name}:{start}", words))
        pending = ""
    return commands
