"""``miles-nemogym serve``: the NeMo-Gym environment side in one command.

Builds (first run, minutes) or reuses the pinned server venv, composes the
``mini_swe_agent_2`` config for the chosen sandbox provider, starts the server, prints
the ``NEMO_GYM_URL`` the trainer side exports, and runs until Ctrl-C or SIGTERM, then
stops the server and its Ray (a cluster joined with ``--ray-address`` keeps running).
``--dry-run`` prints the composed config and what the provider lacks, and starts nothing.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from miles_nemogym.cli.options import SANDBOXES, metavar

if TYPE_CHECKING:
    from rich.console import Console

    from miles_nemogym.gym.config import ServeOptions
    from miles_nemogym.gym.server import GymServer
from miles_nemogym.cli.signals import interrupt_on_sigterm

_SANDBOX_HELP = (
    "Sandbox provider: a container one (what SWE-bench grading needs), or local (host subprocesses, "
    "no isolation, cannot resolve instances)."
)

_HELP = """Run the real NeMo-Gym mini_swe_agent_2 server for training or evaluation.

Episodes run as Ray tasks: on a private Ray on this machine, or spread over a running
cluster with --ray-address (docs/scale-out.md). --dry-run shows the composed server config
and what the sandbox provider still needs (credentials, binaries) without starting anything.

The first run builds the server's Python 3.13 environment (2-5 minutes, once; pip's log is
kept next to it) under ~/.cache/miles-nemogym/gym-venv, or $MILES_NEMOGYM_CACHE. The
interpreter is found on PATH, in pyenv or /usr/bin, or named by MILES_NEMOGYM_GYM_PYTHON.
"""


def serve(
    sandbox: Annotated[str, typer.Option("--sandbox", metavar=metavar(SANDBOXES), help=_SANDBOX_HELP)] = "docker",
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
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            metavar="HOST:PORT",
            help="Join this running Ray cluster (its head's GCS address) instead of starting a private "
            "Ray; run serve on one of its nodes. RAY_ADDRESS in the environment is ignored.",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print the composed server config and what is missing; start and build nothing."
        ),
    ] = False,
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
                "ray_address": ray_address,
            }
        )
    except ValidationError as exc:
        for line in problems(exc, as_flag):
            console.print(f"[red]error:[/red] {escape(line)}")
        raise typer.Exit(2) from None
    except GymEnvironmentError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None

    if dry_run:
        try:
            code = _dry_run(options, state_dir, console)
        except GymEnvironmentError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}")
            raise typer.Exit(2) from None
        raise typer.Exit(code)
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
                f"{_ray_line(server)}On the training node:\n\n    export NEMO_GYM_URL={gym_url}\n\n"
                f"log: {server.log_path}\nresults: {server.state_dir}/results\nPress Ctrl-C to stop."
            )
            while server.is_running():
                time.sleep(1.0)
            console.print(f"[red]the server exited unexpectedly[/red]; log {server.log_path}:\n{server.log_tail()}")
            raise typer.Exit(1)
        except KeyboardInterrupt:
            joined = options.ray_address is not None
            console.print(f"stopping the server{' (the Ray cluster keeps running)' if joined else ' and its Ray'}...")
        finally:
            server.stop()
    console.print("stopped.")


def _ray_line(server: GymServer) -> str:
    if not server.options.ray_address:
        return ""
    nodes = server.cluster_nodes
    cpus = sum(node.cpus for node in nodes)
    return f"Episodes run on the Ray cluster at {server.options.ray_address}: {len(nodes)} nodes, {cpus:g} CPUs.\n"


def _dry_run(options: ServeOptions, state_dir: Path | None, console: Console) -> int:
    """Print the composed config (stdout) and what is missing (stderr); 1 when something is."""
    import yaml
    from rich.markup import escape

    from miles_nemogym.gym import providers
    from miles_nemogym.gym.cluster import unreachable
    from miles_nemogym.gym.config import planned_config
    from miles_nemogym.gym.server import free_port
    from miles_nemogym.gym.venv import READY_MARKER, GymEnvironmentError, find_gym_python, gym_venv_root, venv_key

    port = options.port or free_port(options.host)
    config = planned_config(options, port, state_dir.resolve() if state_dir else Path("<state-dir>"))
    print(f"# miles-nemogym serve --sandbox {options.sandbox} --dry-run: nothing was started.")
    print("# The server config: nemo-gym's shipped configs and serve's options (secrets hidden).")
    print(yaml.safe_dump(providers.redacted(config), sort_keys=False), end="")
    missing = providers.missing(options.sandbox, config)
    venv = gym_venv_root() / venv_key(options.sandbox)
    if (venv / READY_MARKER).is_file():
        console.print(f"server environment: {escape(str(venv))}", highlight=False)
    else:
        try:
            python = find_gym_python()
            console.print(f"server environment: built on the first serve (2-5 minutes) with {python}", highlight=False)
        except GymEnvironmentError as exc:
            missing.append(str(exc).splitlines()[0])
    if options.ray_address:
        refused = unreachable(options.ray_address)
        if refused:
            missing.append(f"a Ray cluster at {options.ray_address} (cannot connect: {refused})")
        else:
            console.print(f"Ray: joins {options.ray_address} (each node is checked when serve starts)", highlight=False)
    if not missing:
        console.print(f"[green]nothing missing for the {options.sandbox} sandbox.[/green]")
        return 0
    console.print(f"[red]missing for the {options.sandbox} sandbox:[/red]")
    for line in missing:
        console.print(f"  - {escape(line)}", highlight=False)
    return 1


def register(app: typer.Typer) -> None:
    app.command("serve", help=_HELP)(serve)
