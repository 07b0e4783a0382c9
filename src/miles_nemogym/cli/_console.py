"""The commands' terminal: one output rule for every console, refusals, SIGTERM and SIGHUP as Ctrl-C, a step display."""

from __future__ import annotations

import os
import re
import signal
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

__all__ = ["console", "fail", "interrupt_on_signals", "step_display"]

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


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGHUP:  # the terminal is gone: what the clean-up prints to it goes nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        for descriptor in (1, 2):
            # A terminal (isatty is False once it hung up); a file or a pipe (> serve.log) keeps the lines.
            if stat.S_ISCHR(os.fstat(descriptor).st_mode):
                os.dup2(devnull, descriptor)
        os.close(devnull)
    raise KeyboardInterrupt


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""A ``kill`` and a closed terminal: each stops a command as Ctrl-C does, so what it started stops too."""


@contextmanager
def interrupt_on_signals(*, ctrl_c: bool = False) -> Iterator[None]:
    """Inside, SIGTERM and SIGHUP raise ``KeyboardInterrupt``; ``ctrl_c`` also re-enables Ctrl-C (a
    shell starts background jobs with SIGINT ignored). Off the main thread, signals stay as they are."""
    try:
        # An ignored SIGHUP (nohup) stays ignored: the user asked the command to outlive the terminal.
        stops = [s for s in _STOP_SIGNALS if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN)]
        previous = {signum: signal.signal(signum, _raise_interrupt) for signum in stops}
    except ValueError:  # not the main thread
        yield
        return
    if ctrl_c:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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
