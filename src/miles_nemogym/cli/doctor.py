"""``miles-nemogym doctor``: :mod:`miles_nemogym.doctor`'s checks on a terminal; exit 0 only when all pass."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from miles_nemogym.cli.options import GymUrl
from miles_nemogym.doctor import DEFAULT_TIMEOUT_S, CheckResult

_COLOURS = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}


def _render(results: list[CheckResult]) -> None:
    """Print :func:`miles_nemogym.doctor.report` wrapped between words, its marks in colour."""
    from rich.console import Console
    from rich.markup import escape

    from miles_nemogym.doctor import report
    from miles_nemogym.fit import wrap

    out = Console()
    for line in report(results):
        mark = line.partition(" ")[0]
        colour = _COLOURS.get(mark)
        first, *more = wrap(line, max(out.width, 80), indent="     ")
        out.print(f"[{colour}]{mark}[/]{escape(first[len(mark) :])}" if colour else escape(first), soft_wrap=True)
        for piece in more:
            out.print(escape(piece), soft_wrap=True, highlight=False)


def _doctor(
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
    policy_base_url: Annotated[
        str | None,
        typer.Option(
            "--policy-base-url",
            help="Also check that this OpenAI-compatible endpoint answers (what `scan --policy-base-url` needs).",
        ),
    ] = None,
) -> None:
    """Check in seconds that NeMo-Gym is reachable and will use the trainer's policy URL.

    A scan needs the same server checks; `scan --golden` needs a server started with `serve --golden`,
    `scan --policy-base-url URL` a policy that answers (add the same flag here)."""
    from miles_nemogym.doctor import all_passed, run_checks

    # The checks read the plugin's variables as the trainer would, the flag in place of NEMO_GYM_URL.
    environ = dict(os.environ) if gym_url is None else {**os.environ, "NEMO_GYM_URL": gym_url}
    origin = None if gym_url is None else "--gym-url"
    results = run_checks(
        session_host=session_host,
        timeout_s=timeout,
        environ=environ,
        gym_url_origin=origin,
        policy_base_url=policy_base_url,
    )
    _render(results)
    raise typer.Exit(0 if all_passed(results) else 1)


def register(app: typer.Typer) -> None:
    app.command(name="doctor")(_doctor)
