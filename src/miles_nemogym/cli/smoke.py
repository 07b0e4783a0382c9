"""``miles-nemogym smoke``: see the whole chain work on a laptop (no GPU, no Docker)."""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

_EXPLANATION = (
    "This run used the 'local' sandbox: commands ran on this machine, not in the SWE-bench task "
    "containers, so grading cannot resolve instances (reward 0.0 is expected). For the real "
    "thing, run `miles-nemogym serve --sandbox docker` on a Docker host (NeMo-Gym's docker provider), "
    "check it with `miles-nemogym scan --golden`, then train with examples/swebench_grpo/run.py."
)

_HELP = """Run the five SWE-bench Verified rows nemo-gym ships through the real NeMo-Gym server and
the agent function, exactly as Miles calls it (no GPU, no Docker).

The first run builds the server's Python 3.13 environment (2-5 minutes, once; pip's log is
kept next to it) under ~/.cache/miles-nemogym/gym-venv, or $MILES_NEMOGYM_CACHE. The
interpreter is found on PATH, in pyenv or /usr/bin, or named by MILES_NEMOGYM_GYM_PYTHON.
"""


@contextmanager
def _quiet_episode_warnings() -> Iterator[None]:
    """The agent logs each failed episode as a WARNING for trainers; here the table shows
    every one of them with its reason, so the raw lines would only repeat it, unexplained."""
    logger = logging.getLogger("miles_nemogym")
    handler = logging.NullHandler()
    previous = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = previous


def _smoke(
    policy_base_url: Annotated[
        str | None,
        typer.Option(
            "--policy-base-url",
            help="A real OpenAI-compatible endpoint (…/v1) instead of the scripted recording policy; "
            "its key from NEMO_GYM_POLICY_API_KEY.",
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=5, help="Run only the first N rows.")] = None,
    step_limit: Annotated[int, typer.Option("--step-limit", min=1, help="Model calls per episode.")] = 10,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="Where the server's log and trajectories go (kept).")
    ] = None,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", help="Also write the result as JSON to this file (one object, every episode)."),
    ] = None,
) -> None:
    from rich.console import Console

    from miles_nemogym.cli.progress import step_display
    from miles_nemogym.cli.smoke_view import LEGEND, build_table, episode_line, report_json
    from miles_nemogym.gym import wheel as gym_wheel
    from miles_nemogym.gym.venv import GymEnvironmentError
    from miles_nemogym.settings import SettingsError
    from miles_nemogym.testing.smoke import SmokeEpisode, expected_offline, run_smoke

    # Logs and CI capture have no terminal width: lay out for 80 columns there too.
    console = Console() if sys.stdout.isatty() else Console(width=80)
    folder = state_dir or Path(tempfile.mkdtemp(prefix="miles-nemogym-smoke-"))
    try:
        rows = gym_wheel.example_rows()[:limit]
    except (OSError, RuntimeError) as error:  # the pinned wheel could not be downloaded or read
        console.print(f"[red]cannot read the example rows nemo-gym ships:[/red] {error}", highlight=False)
        raise typer.Exit(2) from None
    offline = [rows[i]["instance_id"] for i in expected_offline([row["repo"] for row in rows])]
    console.print(f"smoke: {len(rows)} SWE-bench Verified rows through the real NeMo-Gym server", highlight=False)
    if offline:
        console.print(
            f"expected here: without network, {' and '.join(offline)} come back set aside: their "
            "eval scripts download test requirements from GitHub.",
            highlight=False,
        )
    counts = {"running": 0, "done": 0}
    try:
        with step_display(console) as progress, _quiet_episode_warnings():

            def running(count: int) -> None:
                counts["running"] = count
                progress(f"  {count} running, 0 done")

            def finished(episode: SmokeEpisode) -> None:
                counts["running"] -= 1
                counts["done"] += 1
                console.print(episode_line(episode), highlight=False)
                progress(f"  {counts['running']} running, {counts['done']} done")

            report = run_smoke(
                state_dir=folder,
                limit=limit,
                policy_base_url=policy_base_url,
                step_limit=step_limit,
                progress=progress,
                on_episode=finished,
                on_running=running,
            )
    except GymEnvironmentError as error:
        console.print(f"[red]cannot start the NeMo-Gym server:[/red] {error}", highlight=False)
        raise typer.Exit(2) from None
    except SettingsError as error:
        console.print(str(error), style="red", highlight=False, markup=False)
        raise typer.Exit(2) from None

    table, notes = build_table(report.episodes)
    console.print(table)
    for number, text in enumerate(notes.texts, 1):
        console.print(f"[{number}] {text}", highlight=False, markup=False)
    console.print(LEGEND, highlight=False)
    console.print(f"prompt data: {report.data_path}", highlight=False)
    console.print(f"trajectories and results: {report.results_dir}", highlight=False)
    console.print(f"server log: {report.server_log}", highlight=False)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report_json(report), indent=2) + "\n", encoding="utf-8")
        console.print(f"json: {json_path}", highlight=False)
    console.print(_EXPLANATION, highlight=False)
    if not report.chain_worked:
        console.print("[red]the chain did not work: no episode came back as a valid measurement[/red]")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("smoke", help=_HELP)(_smoke)
