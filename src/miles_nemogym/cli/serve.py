"""``miles-nemogym serve``: the NeMo-Gym environment side in one command.

Builds (first run, minutes) or reuses the pinned server venv, composes the
``mini_swe_agent_2`` config for the chosen sandbox provider, starts the server, prints
the ``NEMO_GYM_URL`` the trainer side exports, and runs until Ctrl-C or SIGTERM, then
stops the server and its Ray.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated

import typer

from miles_nemogym.cli.options import SANDBOXES, metavar
from miles_nemogym.cli.signals import interrupt_on_sigterm

SANDBOX_HELP = (
    "Sandbox provider: a container one (what SWE-bench grading needs), or local (host subprocesses, "
    "no isolation, cannot resolve instances)."
)

HELP = """Run the real NeMo-Gym mini_swe_agent_2 server for training or evaluation.

The first run builds the server's Python 3.13 environment (2-5 minutes, once; pip's log is
kept next to it) under ~/.cache/miles-nemogym/gym-venv, or $MILES_NEMOGYM_CACHE. The
interpreter is found on PATH, in pyenv or /usr/bin, or named by MILES_NEMOGYM_GYM_PYTHON.
"""


def serve(
    sandbox: Annotated[str, typer.Option("--sandbox", metavar=metavar(SANDBOXES), help=SANDBOX_HELP)] = "docker",
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; 0.0.0.0 lets trainers on other machines connect.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to bind; 0 picks a free one.")] = 12000,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Episodes the server runs at once.")] = 16,
    golden: Annotated[
        bool, typer.Option("--golden", help="Golden mode: apply each instance's gold patch, no model calls.")
    ] = False,
    provider_config: Annotated[
        Path | None,
        typer.Option(
            "--provider-config",
            help="YAML file of provider options, merged over nemo-gym's own `sandbox.<provider>` block.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    step_limit: Annotated[int, typer.Option("--step-limit", help="Model calls per episode.")] = 250,
    step_timeout: Annotated[int, typer.Option("--step-timeout", help="Seconds per bash command.")] = 600,
    eval_timeout: Annotated[int, typer.Option("--eval-timeout", help="Seconds for SWE-bench grading.")] = 1800,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir", help="Folder for the server log, results and temp files (default: a new temp folder)."
        ),
    ] = None,
    start_timeout: Annotated[
        float, typer.Option("--start-timeout", help="Seconds to wait for the server to answer.")
    ] = 300.0,
) -> None:
    from pydantic import ValidationError
    from rich.console import Console
    from rich.markup import escape

    from miles_nemogym.cli.progress import step_display
    from miles_nemogym.gym.config import ServeOptions, load_provider_options
    from miles_nemogym.gym.server import GymServer
    from miles_nemogym.gym.venv import GymEnvironmentError, ensure_gym_venv
    from miles_nemogym.validation import as_flag, problems

    console = Console(stderr=True)
    if not (math.isfinite(start_timeout) and start_timeout > 0):
        console.print(
            f"[red]error:[/red] --start-timeout: {start_timeout:g} is not a positive number of seconds; "
            "give how long to wait for the server to answer, e.g. --start-timeout 300"
        )
        raise typer.Exit(2)
    try:
        options = ServeOptions.model_validate(
            {
                "sandbox": sandbox,
                "host": host,
                "port": port,
                "concurrency": concurrency,
                "step_limit": step_limit,
                "step_timeout": step_timeout,
                "eval_timeout": eval_timeout,
                "golden": golden,
                "provider_options": load_provider_options(provider_config) if provider_config else {},
            }
        )
    except ValidationError as exc:
        for line in problems(exc, as_flag):
            console.print(f"[red]error:[/red] {escape(line)}")
        raise typer.Exit(2) from None
    except GymEnvironmentError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None

    if options.sandbox == "local":
        console.print(
            "[yellow]--sandbox local runs the agent's commands on this host without isolation, and "
            "grading without the task containers cannot resolve instances (reward 0.0). Use a container "
            "provider (e.g. --sandbox docker on a Docker host) for real training.[/yellow]"
        )
    if options.golden:
        console.print("[yellow]golden mode: no model calls; each /run applies the instance's gold patch.[/yellow]")

    with interrupt_on_sigterm(ctrl_c=True):
        server: GymServer | None = None
        try:
            with step_display(console) as progress:
                venv = ensure_gym_venv(options.sandbox, progress=progress)
                progress(
                    f"starting NeMo-Gym {options.sandbox} server on {options.host}:{options.port or 'a free port'}"
                )
                server = GymServer(
                    options, state_dir=state_dir, venv=venv, progress=progress, start_timeout=start_timeout
                )
                started = time.monotonic()
                server.start()
        except GymEnvironmentError as exc:
            console.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            if server is not None:
                server.stop()
            console.print("interrupted; nothing left running.")
            raise typer.Exit(130) from None

        try:
            gym_url = server.advertised_url
            console.print(
                f"[green]NeMo-Gym mini_swe_agent_2 is serving[/green] ({options.sandbox} sandbox, concurrency "
                f"{options.concurrency}, ready in {time.monotonic() - started:.0f} s).\n"
                f"On the training node:\n\n    export NEMO_GYM_URL={gym_url}\n\n"
                f"log: {server.log_path}\nresults: {server.state_dir}/results\nPress Ctrl-C to stop."
            )
            while server.is_running():
                time.sleep(1.0)
            console.print(f"[red]the server exited unexpectedly[/red]; log {server.log_path}:\n{server.log_tail()}")
            raise typer.Exit(1)
        except KeyboardInterrupt:
            console.print("stopping the server and its Ray...")
        finally:
            server.stop()
    console.print("stopped.")


def register(app: typer.Typer) -> None:
    app.command("serve", help=HELP)(serve)
