"""Plain text fitted to a terminal's width: lines wrapped between words, tables that drop columns.

80 columns is the floor: a narrower or unknown terminal gets 80. A word longer than the
width (a path, an instance id) is kept whole on its own line, never split.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence

__all__ = ["MIN_WIDTH", "table", "terminal_width", "wrap"]

MIN_WIDTH = 80
_GAP = "  "


def terminal_width() -> int:
    """The terminal's columns (``COLUMNS`` when set), at least ``MIN_WIDTH``."""
    return max(shutil.get_terminal_size((MIN_WIDTH, 24)).columns, MIN_WIDTH)


def wrap(lines: list[str], width: int, indent: str = "") -> list[str]:
    """Each of ``lines`` in pieces of at most ``width`` columns, broken only at spaces; continuation
    lines start with ``indent``; a line's leading spaces are kept."""
    pieces: list[str] = []
    for line in lines:
        lead = line[: len(line) - len(line.lstrip(" "))]
        pieces += textwrap.wrap(
            line, width, subsequent_indent=lead + indent, break_long_words=False, break_on_hyphens=False
        ) or [line]
    return pieces


def table(rows: Sequence[Sequence[str]], width: int, drop_order: Sequence[int] = ()) -> str:
    """``rows`` (a header is just the first) as aligned columns two spaces apart within ``width``.

    The last column wraps between its items (``a 1, b 2`` at the commas, ``x  y`` at the double
    spaces, else at spaces; continuations aligned under it); while the table is still too
    wide, the columns in ``drop_order`` (indexes, least wanted first) are left out. Other
    cells are never cut, so an id stays whole.
    """
    keep = list(range(len(rows[0]))) if rows else []
    droppable = list(drop_order)
    while True:
        cells = [[row[i] for i in keep] for row in rows]
        text = _render(cells, width) if cells else ""
        if text is not None:
            return text
        if not droppable:
            return _natural(cells)  # too wide whatever is dropped: the kept columns uncut
        keep.remove(droppable.pop(0))


def _widths(lines: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]


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
    widths = _widths(lines)
    start = sum(widths[:-1]) + len(_GAP) * (len(widths) - 1)
    room = width - start
    needed = 0
    for line in lines:
        items, separator = _items(line[-1])
        needed = max(needed, *(len(item) + len(separator.rstrip()) for item in items))
    if room < needed:
        return None
    out = []
    for line in lines:
        head = _GAP.join(cell.ljust(size) for cell, size in zip(line[:-1], widths, strict=False))
        prefix = head + _GAP if len(line) > 1 else ""
        pieces = _fill(line[-1], room)
        out.append((prefix + pieces[0]).rstrip())
        out += [(" " * len(prefix) + piece).rstrip() for piece in pieces[1:]]
    return "\n".join(out)


def _natural(lines: Sequence[Sequence[str]]) -> str:
    widths = _widths(lines)
    return "\n".join(
        _GAP.join(cell.ljust(size) for cell, size in zip(line, widths, strict=True)).rstrip() for line in lines
    )
