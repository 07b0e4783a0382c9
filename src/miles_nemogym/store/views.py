"""``browse``: what ``miles-nemogym episodes DIR`` asks (a table per step, a list, one episode, the
HTML page, the plots), drawn by ``_browser``, ``_page`` and ``_plots`` over ``_reader.load``."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Collection
from pathlib import Path

import typer

from miles_nemogym import fit
from miles_nemogym.data import write_file
from miles_nemogym.episode.record import EpisodeRecord
from miles_nemogym.fit import terminal_width
from miles_nemogym.store._browser import (
    episode_list_text,
    episode_parts,
    failure_lines,
    head_groups,
    known_elsewhere,
    printable,
    quality_label,
    select,
    server_error,
    several_environments,
    step_label,
    summary_rows,
    table_text,
    trajectory_counts,
    trim,
    verdict_label,
)
from miles_nemogym.store._page import render_html
from miles_nemogym.store._plots import plots, svg
from miles_nemogym.store._reader import StoredEpisode, count_text, load, reward_text, verdict

__all__ = ["browse", "count_text", "load", "offline_note", "reward_text", "verdict"]

_PROBLEMS_SHOWN = 20  # unreadable or odd lines or files listed one by one; past it, counted
_ERROR_LINES_SHOWN = 8  # --show prints a server error's last lines (a Ray traceback runs to ~90)

OFFLINE_REASON = (
    "expected without network: the eval script downloads test requirements from GitHub "
    "(raw.githubusercontent.com); the episode is set aside, not scored"
)


def offline_note(record: EpisodeRecord | None) -> str | None:
    """``OFFLINE_REASON`` for an episode set aside as GitHub was unreachable from the grader, else None."""
    if record is None or not record.mask_sample:
        return None
    reason = record.failure_reason or ""
    return OFFLINE_REASON if "ConnectionError" in reason and "githubusercontent" in reason else None


def browse(
    directory: Path,
    *,
    show: str | None = None,
    list_ids: bool = False,
    instance: str | None = None,
    kind: str | None = None,
    step: int | None = None,
    environments: Collection[str] | None = None,
    html_out: Path | None = None,
    plots_out: Path | None = None,
) -> None:
    """``miles-nemogym episodes``: print what is asked for, ``typer.Exit(2)`` on a refusal; a filter
    that matches nothing says so on stderr and returns (no table, no page)."""
    if not directory.is_dir():
        typer.echo(f"error: {directory} is not a folder; give the episode store (NEMO_GYM_EPISODE_DIR)", err=True)
        raise typer.Exit(2)
    if html_out is not None:
        _check_page_target(html_out, directory)
    if plots_out is not None:
        _check_plots_folder(plots_out, directory)
    store = load(directory)  # without answers: the table reads no trajectories
    skipped = list(store.problems)
    try:
        if show is not None:
            scope = select(store.episodes, environments=environments)
            matches = [e for e in scope if e.episode_id == show] or [e for e in scope if e.episode_id.startswith(show)]
            if len(matches) != 1:
                found = "no episode has that id" if not matches else f"{len(matches)} episodes start with it"
                typer.echo(f"error: --show {show}: {found}; --list prints every episode's id", err=True)
                raise typer.Exit(2)
            full = load(directory, answers=True, steps={matches[0].step})
            skipped += [problem for problem in full.problems if problem not in skipped]
            text = _show_text(next((e for e in full.episodes if e.episode_id == matches[0].episode_id), matches[0]))
            # A terminal would cut a word at its edge: wrapped between words there; whole lines in a pipe.
            typer.echo("\n".join(fit.wrap(text.splitlines(), terminal_width())) if _stdout_is_terminal() else text)
            return
        if not store.episodes:
            typer.echo(f"no episodes in {directory} (expected train/ and eval/ folders of *.jsonl.gz files)")
            return
        chosen = select(store.episodes, instance=instance, kind=kind, step=step, environments=environments)
        if list_ids and chosen:  # whole ids (--show takes them), role, step and verdict
            rows = [tuple(map(printable, (e.episode_id, e.role, step_label(e.step), verdict_label(e)))) for e in chosen]
            typer.echo(fit.table([("episode", "role", "step", "verdict"), *rows], terminal_width(), drop_order=(1,)))
            return
        if not chosen:
            given = {"--instance": instance, "--kind": kind, "--step": step}
            filters = " ".join(f"{name} {value}" for name, value in given.items() if value is not None)
            filters = " ".join([filters, *(f"--env {name}" for name in environments or [])]).strip()
            typer.echo(f"no episodes match {filters} (of {len(store.episodes)} in {directory})", err=True)
            return
        if plots_out is not None:
            _write_plots(plots_out, directory, chosen)
        if html_out is not None:
            store = load(directory, answers=True, steps={e.step for e in chosen})
            skipped += [problem for problem in store.problems if problem not in skipped]
            store.episodes = select(store.episodes, instance=instance, kind=kind, step=step, environments=environments)
            _write_page(html_out, render_html(store, f"Episodes in {directory}"))
            typer.echo(f"wrote {html_out} ({len(store.episodes)} episodes)")
        if html_out is not None or plots_out is not None:
            return
        width = terminal_width()
        typer.echo(table_text(summary_rows(chosen), width, quality_label(chosen)))
        if several_environments(chosen):
            typer.echo("")
            typer.echo(table_text(summary_rows(chosen, per_environment=True), width))
        if instance is not None or kind is not None or step is not None:
            typer.echo("")
            typer.echo(episode_list_text(chosen, width))
    finally:  # after what was asked for, so it is the last thing read
        _warn_skipped([printable(str(problem)) for problem in skipped])


def _packed(items: list[str], width: int) -> list[str]:
    """``items`` three spaces apart, as many to a line as fit ``width`` (an item never split)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 3 + len(item) <= width:
            lines[-1] += "   " + item
        else:
            lines.append(item)
    return lines


def _failure_lines(episode: StoredEpisode) -> list[str]:
    """A set-aside episode's failure, smoke's no-network note, the server's error's last lines and where it is."""
    lines = list(failure_lines(episode))
    note = offline_note(episode.typed)
    if note:
        lines.append(f"note: {note}")  # smoke's own note for it
    error = server_error(episode)
    if error is None:
        return lines
    error_lines = error.splitlines()
    if len(error_lines) <= _ERROR_LINES_SHOWN:
        return [*lines, "the server's error, whole:", *error_lines]
    source = episode.source
    place = "its store line" if source is None else f"line {source.line} of {source.path}"
    return [
        *lines,
        f"the server's error, last {_ERROR_LINES_SHOWN} of {len(error_lines)} lines (whole: answer.metadata.error "
        f"on {place}, or in the --html page):",
        *error_lines[-_ERROR_LINES_SHOWN:],
    ]


def _show_text(episode: StoredEpisode) -> str:
    """One episode for ``--show``: its head (within 80 columns unless one id is wider, a set-aside episode's
    failure), then the rest as every view shows it, trimmed."""
    head = [line for group in head_groups(episode) for line in _packed(group, fit.MIN_WIDTH)]
    head.append(trajectory_counts(episode))
    head += [part if isinstance(part, str) else part.text for part in known_elsewhere(episode.entry)]
    if episode.masked:
        head += _failure_lines(episode)
    parts = episode_parts(episode)
    body = parts[parts.index("") :] if "" in parts else []
    rest = [p if isinstance(p, str) else p.text if p.show_limit is None else trim(p.text, p.show_limit) for p in body]
    return printable("\n".join([*head, *rest]))


def _warn_skipped(problems: list[str]) -> None:
    lines = [f"warning: {problem}" for problem in problems[:_PROBLEMS_SHOWN]]
    if len(problems) > _PROBLEMS_SHOWN:
        lines.append(f"warning: {len(problems) - _PROBLEMS_SHOWN} more unreadable or odd lines or files")
    if lines:  # wrapped between words on a terminal (a path is never split); whole lines in logs
        shown = fit.wrap(lines, terminal_width(), indent="    ") if _stderr_is_terminal() else lines
        typer.echo("\n".join(shown), err=True)


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def _stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


_WHAT = {"--html": "page", "--plots": "plots"}


def _refuse(message: str, option: str = "--html") -> typer.Exit:
    typer.echo(f"error: {option} {message}", err=True)
    return typer.Exit(2)


def _inside(real: Path, store: Path) -> bool:
    """Whether ``real`` (a resolved path) is the store or in it."""
    real_store = Path(os.path.realpath(store))
    return real == real_store or real_store in real.parents


def _check_page_target(out: Path, store: Path, option: str = "--html") -> None:
    """Refuse a page target in a missing folder, in the store, a link, not a regular file, or read-only."""
    parent = out.parent
    if not parent.is_dir():
        raise _refuse(f"{out}: the folder {parent} does not exist; create it or give another path", option)
    if _inside(Path(os.path.realpath(parent)) / out.name, store):  # its name not followed
        raise _refuse(f"{out} is inside the episode store {store}; write the {_WHAT[option]} outside it", option)
    try:
        mode = out.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise _refuse(f"{out}: {error.strerror}", option) from None
    if stat.S_ISLNK(mode):
        raise _refuse(f"{out} is a symbolic link; give the path of a regular file", option)
    if stat.S_ISDIR(mode):
        raise _refuse(f"{out} is a folder; give a file path such as {out / 'episodes.html'}", option)
    if not stat.S_ISREG(mode):
        raise _refuse(f"{out} is not a regular file (a device, pipe or socket); give a file path", option)
    if not mode & 0o222:
        raise _refuse(f"{out} is read-only; give another path or make it writable", option)


def _check_plots_folder(folder: Path, store: Path) -> None:
    """Refuse a plots folder in the store, not a folder, or missing in a missing parent (files: as pages)."""
    if _inside(Path(os.path.realpath(folder)), store):  # through a link too: the files go there
        raise _refuse(f"{folder} is inside the episode store {store}; write the plots outside it", "--plots")
    if folder.is_dir():
        return
    if os.path.lexists(folder):
        raise _refuse(f"{folder} is not a folder; give a folder for the .svg files", "--plots")
    if not folder.parent.is_dir():
        raise _refuse(f"{folder}: the folder {folder.parent} does not exist; create it or give another path", "--plots")


def _write_plots(folder: Path, store: Path, chosen: list[StoredEpisode]) -> None:
    """One standalone ``.svg`` per plot of ``chosen`` in ``folder``, each written as the page is."""
    drawn = plots(chosen)
    if not drawn:
        typer.echo(f"no rollout step sealed yet in {store}: no plots written", err=True)
        return
    try:
        folder.mkdir(exist_ok=True)
    except OSError as error:
        raise _refuse(f"{folder}: cannot make the folder: {error.strerror or error}", "--plots") from None
    for plot in drawn:
        out = folder / f"{plot.name}.svg"
        _check_page_target(out, store, "--plots")
        _write_page(out, '<?xml version="1.0" encoding="UTF-8"?>\n' + svg(plot) + "\n", "--plots")
    typer.echo(f"wrote {len(drawn)} plots to {folder}: " + ", ".join(f"{p.name}.svg" for p in drawn))


def _write_page(out: Path, page: str, option: str = "--html") -> None:
    """``page`` as a new file renamed over ``out``: a reader sees the old page or the new, and a link put
    at ``out`` meanwhile is replaced, never written through."""
    try:
        write_file(out, page.encode())
    except OSError as error:  # WriteError: "cannot write OUT: why"
        raise _refuse(f"{error} (the {_WHAT[option]})", option) from None
