"""``miles-nemogym episodes DIR``: browse an episode store (``NEMO_GYM_EPISODE_DIR``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

_PROBLEMS_SHOWN = 20
"""Unreadable or odd lines or files listed one by one; past it, counted."""


def episodes(
    directory: Annotated[
        Path, typer.Argument(help="The episode store folder (NEMO_GYM_EPISODE_DIR, or the launcher's --episode-dir).")
    ],
    show: Annotated[
        str | None, typer.Option("--show", help="Render one episode (id, or a unique prefix) turn by turn.")
    ] = None,
    instance: Annotated[str | None, typer.Option("--instance", help="Only episodes of this instance_id.")] = None,
    kind: Annotated[
        str | None,
        typer.Option("--kind", help="Only episodes with this verdict: resolved, unresolved, or a failure kind."),
    ] = None,
    step: Annotated[int | None, typer.Option("--step", help="Only episodes of this rollout step.")] = None,
    html_out: Annotated[Path | None, typer.Option("--html", help="Write one self-contained HTML page here.")] = None,
) -> None:
    """A table per rollout step; with a filter, one line per episode; --show one episode; --html a page."""
    from miles_nemogym.store.browser import episode_list_text, select, show_text, step_rows, table_text
    from miles_nemogym.store.page import render_html
    from miles_nemogym.store.reader import load

    if not directory.is_dir():
        typer.echo(f"error: {directory} is not a folder; give the episode store (NEMO_GYM_EPISODE_DIR)", err=True)
        raise typer.Exit(2)
    store = load(directory)  # without answers: the table reads no trajectories
    skipped = list(store.problems)
    try:
        chosen = select(store.episodes, instance=instance, kind=kind, step=step)
        if show is not None:
            matches = [e for e in store.episodes if e.episode_id.startswith(show)]
            if len(matches) != 1:
                found = "no episode" if not matches else f"{len(matches)} episodes"
                typer.echo(
                    f"error: --show {show}: {found} with that id; list them with --instance/--kind/--step", err=True
                )
                raise typer.Exit(2)
            (match,) = matches
            full = load(directory, answers=True, steps={match.step})
            skipped += [problem for problem in full.problems if problem not in skipped]
            typer.echo(show_text(next((e for e in full.episodes if e.episode_id == match.episode_id), match)))
            return
        if html_out is not None:
            store = load(directory, answers=True, steps={e.step for e in chosen})
            skipped += [problem for problem in store.problems if problem not in skipped]
            store.episodes = select(store.episodes, instance=instance, kind=kind, step=step)
            html_out.write_text(render_html(store, f"Episodes in {directory}"), encoding="utf-8")
            typer.echo(f"wrote {html_out} ({len(store.episodes)} episodes)")
            return
        if not store.episodes:
            typer.echo(f"no episodes in {directory} (expected train/ and eval/ folders of *.jsonl.gz files)")
            return
        typer.echo(table_text(step_rows(chosen)))
        if instance is not None or kind is not None or step is not None:
            typer.echo("")
            typer.echo(episode_list_text(chosen))
    finally:  # after what was asked for, so it is the last thing read
        _warn_skipped([str(problem) for problem in skipped])


def _warn_skipped(problems: list[str]) -> None:
    for problem in problems[:_PROBLEMS_SHOWN]:
        typer.echo(f"warning: {problem}", err=True)
    if len(problems) > _PROBLEMS_SHOWN:
        typer.echo(f"warning: {len(problems) - _PROBLEMS_SHOWN} more unreadable or odd lines or files", err=True)


def register(app: typer.Typer) -> None:
    app.command("episodes")(episodes)
