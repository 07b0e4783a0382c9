"""``miles-nemogym doctor``: the NeMo-Gym checks (:mod:`miles_nemogym.checks`) on a terminal; exit 0 when all pass."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from miles_nemogym import checks
from miles_nemogym.checks import Fetcher
from miles_nemogym.cli._options import GymUrl

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register", "show"]

_COLOURS = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}


def show(console: Console, results: Sequence[checks.CheckResult]) -> None:
    """Print :func:`miles_nemogym.checks.report` wrapped to the console, its marks in colour."""
    from rich.markup import escape

    for line in checks.report(results, max(console.width, 80)):
        mark = line.partition(" ")[0]
        colour = _COLOURS.get(mark)
        text = f"[{colour}]{mark}[/]{escape(line[len(mark) :])}" if colour else escape(line)
        console.print(text, soft_wrap=True, highlight=False)


def run_checks(
    *,
    session_host: str | None = None,
    timeout_s: float = checks.Target.timeout_s,
    fetch: Fetcher = checks.Target.fetch,
    environ: Mapping[str, str] | None = None,
    gym_url_origin: str | None = None,
    policy_base_url: str | None = None,
) -> list[checks.CheckResult]:
    """Doctor's checks, in order: the settings, the Gym server, the policy host, with
    ``policy_base_url`` that it answers, and each resources server in NEMO_GYM_ENVS."""
    target = checks.Target.from_env(
        environ,
        gym_url_origin,
        session_host=session_host,
        timeout_s=timeout_s,
        fetch=fetch,
        policy_base_url=policy_base_url,
    )
    wanted: list[checks.Wanted] = ["settings", "gym answers", "policy field", "policy host"]
    if policy_base_url is not None:
        wanted.append("policy answers")
    return list(checks.run(target, wanted, environments=True))


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
    ] = checks.Target.timeout_s,
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
    from miles_nemogym.cli._console import console

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
    show(console(), results)
    raise typer.Exit(0 if checks.all_passed(results) else 1)


def register(app: typer.Typer) -> None:
    app.command(name="doctor")(_doctor)
