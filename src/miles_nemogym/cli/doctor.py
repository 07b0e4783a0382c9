"""``miles-nemogym doctor``: the fast NeMo-Gym preflight (``miles_nemogym.doctor``) on a terminal.

Exit code 0 only when every check passes, 1 otherwise, so scripts can gate on it.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from miles_nemogym.cli.options import GymUrl
from miles_nemogym.doctor import DEFAULT_TIMEOUT_S, CheckResult, Status


def render(results: list[CheckResult], console: object | None = None) -> None:
    """Print each check, and under each failure its fix."""
    from rich.console import Console
    from rich.markup import escape

    out = console if isinstance(console, Console) else Console()
    marks = {
        Status.passed: "[green]PASS[/]",
        Status.failed: "[red]FAIL[/]",
        Status.skipped: "[yellow]SKIP[/]",
    }
    for result in results:
        out.print(f"{marks[result.status]} {escape(result.name)}: {escape(result.detail)}")
        if result.fix and not result.ok:
            out.print(f"     [bold]fix:[/] {escape(result.fix)}")
    failed = sum(result.status is Status.failed for result in results)
    if failed:
        out.print(f"[red]{failed} check(s) failed[/]")
    elif all(result.ok for result in results):
        out.print("[green]all checks passed[/]")


def doctor(
    gym_url: GymUrl = None,
    session_host: Annotated[
        str | None,
        typer.Option(
            "--session-host",
            help="The --session-server-ip the trainer will use (default 0.0.0.0: the plugin then "
            "sends the address that routes to the Gym host, or MILES_ROUTER_EXTERNAL_HOST).",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, max=600, help="Seconds to wait for the Gym server.")
    ] = DEFAULT_TIMEOUT_S,
) -> None:
    """Check in seconds that NeMo-Gym is reachable and will use the trainer's policy URL."""
    from miles_nemogym.doctor import all_passed, run_checks

    # The checks read the plugin's variables as the trainer would, the flag in place of NEMO_GYM_URL.
    environ = dict(os.environ) if gym_url is None else {**os.environ, "NEMO_GYM_URL": gym_url}
    results = run_checks(session_host=session_host, timeout_s=timeout, environ=environ)
    render(results)
    raise typer.Exit(0 if all_passed(results) else 1)


def register(app: typer.Typer) -> None:
    app.command(name="doctor")(doctor)
