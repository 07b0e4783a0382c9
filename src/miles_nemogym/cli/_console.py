"""The one output rule every command's console follows."""

from __future__ import annotations

import os
import re
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

__all__ = ["console", "fail"]

_UNLIMITED = 10_000
_WORD = re.compile(r"\S+\s*")


def _breaks(plain: str, width: int) -> list[int]:
    """Where one line of ``plain`` breaks to fit ``width``: only before a word."""
    breaks, start = [], 0
    for word in _WORD.finditer(plain):
        if word.start() > start and len(plain[start : word.end()].rstrip()) > width:
            breaks.append(word.start())
            start = word.start()
    return breaks


class _Console(Console):
    def print(self, *objects: Any, **options: Any) -> None:
        """``Console.print``; on a terminal, text wrapped by :func:`_breaks` (rich would fold a
        long word, or crop it)."""
        soft_wrap = options.get("soft_wrap")
        if (self.soft_wrap if soft_wrap is None else soft_wrap) or not all(
            isinstance(item, (str, Text)) for item in objects
        ):
            super().print(*objects, **options)
            return
        markup, highlight = options.pop("markup", None), options.pop("highlight", None)
        text = Text(options.pop("sep", " ")).join(
            self.render_str(item, markup=markup, highlight=highlight) if isinstance(item, str) else item
            for item in objects
        )
        width = min(options.get("width") or self.width, self.width)
        lines = [piece for line in text.split(allow_blank=True) for piece in line.divide(_breaks(line.plain, width))]
        for piece in lines:
            piece.rstrip()
        super().print(Text("\n").join(lines), **{**options, "soft_wrap": True})


def console(*, stderr: bool = False) -> Console:
    """A console on standard output (``stderr``: standard error) that follows the rule: not on a
    terminal, as wide as ``COLUMNS`` says, else without limit. ``:abc:`` in a path stays text."""
    made = _Console(stderr=stderr, emoji=False)
    made.soft_wrap = not made.is_terminal
    if not made.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        made.width = _UNLIMITED  # a table too: in a log every column is kept, none cut
    return made


def fail(console: Console, message: str, code: int = 2, **options: Any) -> NoReturn:
    """Print ``message`` (``options`` as ``Console.print`` takes them) and exit with ``code``."""
    console.print(message, **options)
    raise typer.Exit(code)
