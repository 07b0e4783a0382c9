"""``miles-nemogym episodes DIR``: browse an episode store (``NEMO_GYM_EPISODE_DIR``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]


def episodes(
    directory: Annotated[
        Path, typer.Argument(help="The episode store folder (NEMO_GYM_EPISODE_DIR, or the launcher's --episode-dir).")
    ],
    show: Annotated[
        str | None, typer.Option("--show", help="Render one episode (id, or a unique prefix) turn by turn.")
    ] = None,
    list_ids: Annotated[
        bool, typer.Option("--list", help="Every episode's id (with role, step and verdict), one a line.")
    ] = False,
    instance: Annotated[str | None, typer.Option("--instance", help="Only episodes of this instance_id.")] = None,
    kind: Annotated[
        str | None,
        typer.Option(
            "--kind",
            help="Only episodes with this verdict: resolved, unresolved (SWE), passed, failed (other environments), "
            "or a failure kind.",
        ),
    ] = None,
    step: Annotated[int | None, typer.Option("--step", help="Only episodes of this rollout step.")] = None,
    environments: Annotated[
        list[str] | None,
        typer.Option(
            "--env", help="Only episodes of this environment ('swe' for SWE-bench; repeat for several). Every view."
        ),
    ] = None,
    html_out: Annotated[
        Path | None,
        typer.Option("--html", help="Write one self-contained HTML page here (a new or regular file outside DIR)."),
    ] = None,
    plots_out: Annotated[
        Path | None,
        typer.Option(
            "--plots",
            help="Write one .svg per plot over rollout steps into this folder (made if missing; outside DIR).",
        ),
    ] = None,
) -> None:
    """A table per rollout step (and per environment, when there are several); with a filter, one
    line per episode; --list every episode's id; --show one episode; --html a page; --plots the
    curves over rollout steps as .svg files.

    A filter that matches nothing says so on stderr and exits 0 (no table, no page)."""
    from miles_nemogym.store.views import browse

    browse(
        directory,
        show=show,
        list_ids=list_ids,
        instance=instance,
        kind=kind,
        step=step,
        environments=environments,
        html_out=html_out,
        plots_out=plots_out,
    )


def register(app: typer.Typer) -> None:
    app.command("episodes")(episodes)
