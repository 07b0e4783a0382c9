"""Plain text fitted to a terminal's width (at least 80): lines wrapped between words, tables that
drop columns; a word wider than the width (a path, an id) is kept whole on its own line."""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Sequence

__all__ = ["MIN_WIDTH", "table", "terminal_width", "wrap"]

MIN_WIDTH = 80
_GAP = "  "


def terminal_width() -> int:
    """The terminal's columns (``COLUMNS`` when set), at least ``MIN_WIDTH``."""
    return max(shutil.get_terminal_size((MIN_WIDTH, 24)).columns, MIN_WIDTH)


def wrap(lines: list[str], width: int, indent: str = "") -> list[str]:
    """Each of ``lines`` in pieces of at most ``width`` columns, broken only at spaces, continued after
    its leading spaces and ``indent``."""
    pieces: list[str] = []
    for line in lines:
        lead = line[: len(line) - len(line.lstrip(" "))]
        pieces += textwrap.wrap(
            line, width, subsequent_indent=lead + indent, break_long_words=False, break_on_hyphens=False
        ) or [line]
    return pieces


def table(rows: Sequence[Sequence[str]], width: int, drop_order: Sequence[int] = ()) -> str:
    """``rows`` (a header is just the first) as columns two spaces apart within ``width``: the last
    column wraps between its items (``_items``); while still too wide, the columns in ``drop_order``
    (least wanted first) are left out. Other cells are never cut, so an id stays whole."""
    keep = list(range(len(rows[0]))) if rows else []
    droppable = list(drop_order)
    while True:
        cells = [[row[i] for i in keep] for row in rows]
        text = _render(cells, width) if cells else ""
        if text is not None:
            return text
        if not droppable:  # too wide whatever is dropped: the kept columns uncut
            return _render(cells, sys.maxsize) or ""
        keep.remove(droppable.pop(0))


def _items(cell: str) -> tuple[list[str], str]:
    """A cell's unbreakable parts: items of a ``, `` list, else parts two spaces apart, else words."""
    for separator in (", ", "  "):
        if separator in cell:
            return cell.split(separator), separator
    return cell.split(" "), " "


def _fill(cell: str, room: int) -> list[str]:
    items, separator = _items(cell)
    glue = separator.rstrip()  # a list's comma stays at the end of its line
    lines = [items[0]]
    for item in items[1:]:
        if len(lines[-1] + separator + item + glue) <= room:
            lines[-1] += separator + item
        else:
            lines[-1] += glue
            lines.append(item)
    return lines


def _render(lines: Sequence[Sequence[str]], width: int) -> str | None:
    """The table, or None when it does not fit even with its last column wrapped."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    start = sum(widths[:-1]) + len(_GAP) * (len(widths) - 1)
    room = width - start
    cells = [_items(line[-1]) for line in lines]
    if room < max(len(item) + len(separator.rstrip()) for items, separator in cells for item in items):
        return None
    out = []
    for line in lines:
        head = _GAP.join(cell.ljust(size) for cell, size in zip(line[:-1], widths, strict=False))
        prefix = head + _GAP if len(line) > 1 else ""
        pieces = _fill(line[-1], room)
        out.append((prefix + pieces[0]).rstrip())
        out += [(" " * len(prefix) + piece).rstrip() for piece in pieces[1:]]
    return "\n".join(out)
