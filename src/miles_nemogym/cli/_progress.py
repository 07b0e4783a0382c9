"""One progress display for long preparation steps (the server's first-run build, its start)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

__all__ = ["step_display"]

_RESERVED = 14  # spinner, elapsed time and the gaps between columns


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


@contextmanager
def step_display(console: Console) -> Iterator[Callable[[str], None]]:
    """A ``progress(line)`` callback that drives the display until the block ends."""
    # The detail (pip's counts) goes on a line of its own under the step: both fit at 80 columns.
    columns = (SpinnerColumn(), TextColumn("{task.description}[dim]{task.fields[detail]}[/dim]"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("preparing", detail="")
        current: list[tuple[str, float]] = []

        def finish_step() -> None:
            if current:
                step, started = current.pop()
                took = time.monotonic() - started
                # A step that took no time is a fact, not work: no duration to show.
                suffix = f" [dim]({took:.0f} s)[/dim]" if took >= 1 else ""
                console.print(f"[green]✓[/green] {escape(step)}{suffix}", highlight=False)

        def progress(line: str) -> None:
            room = max(console.width - _RESERVED, 20)
            if line.startswith(" "):
                bar.update(task, detail="\n" + escape(_short(line.strip(), room)), refresh=True)
                return
            finish_step()
            if line.startswith("note:"):
                console.print(line, highlight=False, markup=False)
                return
            current.append((line, time.monotonic()))
            bar.reset(task, description=escape(_short(line, room)), detail="")

        yield progress  # a step the block failed or was interrupted in gets no ✓
        finish_step()
