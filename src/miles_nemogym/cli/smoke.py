"""``miles-nemogym smoke``: see the whole chain work on a laptop (no GPU, no Docker)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

EXPLANATION = (
    "This run used the 'local' sandbox: commands ran on this machine, not in the SWE-bench task "
    "containers, so grading cannot resolve instances (reward 0.0 is expected) and rows whose eval "
    "scripts need network (django, pylint) come back set aside with their failure kind. For the real "
    "thing, run `miles-nemogym serve --sandbox docker` on a Docker host (NeMo-Gym's docker provider), "
    "check it with `miles-nemogym scan --golden`, then train with examples/swebench_grpo/run.py."
)


def smoke(
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
) -> None:
    """Run the shipped SWE-bench Verified examples through the real NeMo-Gym server and the agent function."""
    from rich.console import Console
    from rich.table import Table

    from miles_nemogym.gym.venv import GymEnvironmentError
    from miles_nemogym.smoke import run_smoke

    # Logs and CI capture have no terminal width; the table needs room for its columns.
    console = Console() if sys.stdout.isatty() else Console(width=180)
    folder = state_dir or Path(tempfile.mkdtemp(prefix="miles-nemogym-smoke-"))
    try:
        report = run_smoke(
            state_dir=folder,
            limit=limit,
            policy_base_url=policy_base_url,
            step_limit=step_limit,
            progress=lambda line: console.print(f"[dim]{line}[/dim]", highlight=False),
        )
    except GymEnvironmentError as error:
        console.print(f"[red]cannot start the NeMo-Gym server:[/red] {error}")
        raise typer.Exit(2) from None

    table = Table(title="smoke: one row per episode, as the trainer stores it")
    for column in ("instance", "status", "policy calls", "turns", "tool calls", "patch applied", "F2P pass/fail",
                   "reward", "failure kind", "reason"):  # fmt: skip
        table.add_column(column, overflow="fold")
    for episode in report.episodes:
        record = episode.record
        f2p = record.get("fail_to_pass") or {}
        table.add_row(
            episode.instance_id,
            ("[green]ok[/green]" if record.get("status") == "ok" else "[red]set aside[/red]"),
            "-" if episode.policy_requests is None else str(episode.policy_requests),
            str(record.get("turns", "-")),
            str(record.get("tool_calls", "-")),
            str(record.get("patch_applied", "-")),
            f"{f2p.get('passed', '-')}/{f2p.get('failed', '-')}" if f2p else "-",
            f"{episode.result.get('reward', 0.0):g}",
            record.get("failure_kind") or "-",
            (record.get("failure_reason") or "")[:120],
        )
    console.print(table)
    console.print(f"prompt data: {report.data_path}")
    console.print(f"trajectories and results: {report.results_dir}")
    console.print(f"server log: {report.server_log}")
    console.print(EXPLANATION)
    if not report.chain_worked:
        console.print("[red]the chain did not work: no episode came back as a valid measurement[/red]")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("smoke")(smoke)
