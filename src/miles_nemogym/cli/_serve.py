"""``miles-nemogym serve``: the NeMo-Gym environment side in one command."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from miles_nemogym.cli._console import fail, interrupt_on_signals
from miles_nemogym.cli._options import JUDGE_MODEL_HELP, JUDGE_URL_HELP, SANDBOXES, judge_of

if TYPE_CHECKING:
    from rich.console import Console

    from miles_nemogym.gym.serve import Serve

__all__ = ["register"]

_SANDBOX_HELP = (
    f"Sandbox provider, one of {', '.join(SANDBOXES)}: a container one (what SWE-bench grading needs), "
    "or local (host subprocesses, no isolation, cannot resolve instances)."
)

_ENV_HELP = (
    "Also serve this NeMo-Gym environment's resources server (a folder of resources_servers/ in the "
    "nemo-gym wheel, e.g. mcqa); repeat for several. They take the ports after --port, in the order given."
)

_HELP = """Run the real NeMo-Gym mini_swe_agent_2 server for training or evaluation, and with
--env NAME (repeatable) the resources servers of other NeMo-Gym environments next to it
(--no-swe: only those). It prints the NEMO_GYM_URL and NEMO_GYM_ENVS the trainer exports.
An environment its config gives another agent (gymnasium_agent, ...) also gets that agent
server, its model calls routed to the trainers' sessions (--session-server HOST:PORT), and
serve prints the NEMO_GYM_ROLLOUT_SECRET the trainer signs those episodes with.

SWE episodes run as Ray tasks: on a private Ray on this machine, or spread over a running
cluster with --ray-address (docs/scale-out.md). --dry-run shows the composed server config
and what the sandbox provider still needs (credentials, binaries) without starting anything.

The first run builds the server's Python 3.13 environment (2-5 minutes, once; pip's log is
kept next to it) under ~/.cache/miles-nemogym/gym-venv, or $MILES_NEMOGYM_CACHE. The
interpreter is found on PATH, in pyenv or /usr/bin, or named by MILES_NEMOGYM_GYM_PYTHON.
"""


def serve(
    sandbox: Annotated[str, typer.Option("--sandbox", metavar="PROVIDER", help=_SANDBOX_HELP)] = "docker",
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; 0.0.0.0 lets trainers on other machines connect.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", help="Port to bind; --env servers take the next ones; 0 picks free ones.")
    ] = 12000,
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
            "--state-dir",
            help="Folder for the server log, results and temp files, kept (default: a new temp folder, removed "
            "on stop).",
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
            "--dry-run",
            help="Print the composed server config, the environments and requirements it would start and "
            "install, and what is missing; start and build nothing.",
        ),
    ] = False,
    envs: Annotated[list[str] | None, typer.Option("--env", metavar="NAME", help=_ENV_HELP)] = None,
    swe: Annotated[
        bool,
        typer.Option(
            "--swe/--no-swe", help="Run the SWE-bench mini_swe_agent_2 server (--no-swe: only the --env ones)."
        ),
    ] = True,
    judge_url: Annotated[str | None, typer.Option("--judge-url", metavar="URL", help=JUDGE_URL_HELP)] = None,
    judge_model: Annotated[str | None, typer.Option("--judge-model", metavar="NAME", help=JUDGE_MODEL_HELP)] = None,
    start_anyway: Annotated[
        bool,
        typer.Option(
            "--start-anyway",
            help="Start even when something --dry-run checks is missing (a Docker daemon, credentials, "
            "an environment's variables or sandbox).",
        ),
    ] = False,
    session_servers: Annotated[
        list[str] | None,
        typer.Option(
            "--session-server",
            metavar="HOST:PORT",
            help="A trainer's Miles session server (its --session-server-port; HOST:PORT-PORT for a range) that "
            "agents' model calls may be routed to, repeat for several. Needed by environments played by their own "
            "agent server (gymnasium_agent, tool_simulation_agent, ...); nothing else is reachable through the "
            "routing model, and only calls whose rollout id the trainer signed with the NEMO_GYM_ROLLOUT_SECRET "
            "serve prints.",
        ),
    ] = None,
    routed: Annotated[
        bool,
        typer.Option(
            "--routed",
            help="Play simple_agent environments through their own agent server's /run too (routed), "
            "instead of the loop in the rollout process.",
        ),
    ] = False,
) -> None:
    from pydantic import ValidationError
    from rich.markup import escape

    from miles_nemogym.cli._console import console as cli_console
    from miles_nemogym.cli._console import step_display
    from miles_nemogym.errors import problems
    from miles_nemogym.gym.config import ServeOptions
    from miles_nemogym.gym.serve import Serve
    from miles_nemogym.gym.venv import GymEnvironmentError

    console = cli_console(stderr=True)
    if not (math.isfinite(start_timeout) and start_timeout > 0):
        fail(
            console,
            f"[red]error:[/red] --start-timeout: {start_timeout:g} is not a positive number of seconds; "
            "give how long to wait for the server to answer, e.g. --start-timeout 300",
        )
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
                "provider_options": provider_config or {},
                "ray_address": ray_address,
            }
        )
    except ValidationError as exc:
        for line in problems(exc, as_flag):
            console.print(f"[red]error:[/red] {escape(line)}", soft_wrap=True)
        raise typer.Exit(2) from None
    except GymEnvironmentError as exc:
        fail(console, f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)

    if not swe and not envs:
        fail(console, "[red]error:[/red] --no-swe serves only the --env environments; name one, e.g. --env mcqa")
    judge = judge_of(console, judge_url, judge_model)
    serve = Serve(
        options, envs or [], swe=swe, routed=routed, judge=judge, session_servers=session_servers or [], dry_run=dry_run
    )
    for line in serve.problems:
        console.print(f"[red]error:[/red] {escape(line)}", highlight=False)
    if serve.problems:
        raise typer.Exit(2)
    if dry_run:  # the composed SWE config on stdout; the environments' plan and what is missing on stderr
        missing: list[str] = []
        try:
            for kind, text in serve.dry_run(state_dir):
                if kind == "config":
                    print(text, end="")
                elif kind == "missing":
                    missing.append(text)
                else:
                    console.print(text, highlight=False, markup=False, soft_wrap=True if kind == "value" else None)
        except GymEnvironmentError as exc:
            fail(console, f"[red]error:[/red] {escape(str(exc))}")
        what = f"the {options.sandbox} sandbox" if swe else "the environments"
        console.print(f"[red]missing for {what}:[/red]" if missing else f"[green]nothing missing for {what}.[/green]")
        for line in missing:
            console.print(f"  - {escape(line)}", highlight=False)
        raise typer.Exit(1 if missing else 0)
    refusal = serve.refusal(state_dir, anyway=start_anyway)
    if refusal is not None:
        fail(console, f"[red]error:[/red] {escape(refusal[1])}", refusal[0], highlight=False)
    if swe and options.sandbox == "local":
        console.print(
            "[yellow]--sandbox local runs the agent's commands on this host without isolation, and "
            "grading without the task containers cannot resolve instances (reward 0.0). Use a container "
            "provider (e.g. --sandbox docker on a Docker host) for real training.[/yellow]"
        )
    if swe and options.golden:
        console.print("[yellow]golden mode: no model calls; each /run applies the instance's gold patch.[/yellow]")

    with interrupt_on_signals(ctrl_c=True):
        try:
            with step_display(console) as progress:
                serve.start(state_dir, progress, start_timeout)
        except GymEnvironmentError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)  # it quotes the log
            _kept(serve, console)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            serve.remove()
            fail(console, "interrupted; nothing left running.", 130)
        except BaseException:
            _kept(serve, console)
            raise

        try:
            _print_ready(console, serve, time.monotonic() - serve.started)
            for name, log in serve.wait():
                console.print(f"[red]{escape(name)} exited unexpectedly[/red]; log {escape(log)}", highlight=False)
            _kept(serve, console)
            raise typer.Exit(1)
        except KeyboardInterrupt:
            joined = options.ray_address is not None
            ray = "" if serve.server is None else " (the Ray cluster keeps running)" if joined else " and its Ray"
            console.print(f"stopping the servers{ray}...")
        finally:
            serve.stop()
    removed = serve.remove()
    console.print("stopped." if removed is None else f"stopped; removed {removed}.", highlight=False)


def as_flag(loc: Sequence[int | str]) -> str:
    """Name a field by the command-line flag that sets it (``step_limit`` → ``--step-limit``)."""
    return "--" + "-".join(str(part) for part in loc).replace("_", "-")


def _kept(serve: Serve, console: Console) -> None:
    kept = serve.keep()
    if kept is not None:
        console.print(f"kept {kept} (the logs) to look at; remove it when done", highlight=False, soft_wrap=True)


def _print_ready(console: Console, serve: Serve, took: float) -> None:
    """What is serving and the lines to paste on the training node (never wrapped)."""
    import shlex

    from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import SECRET_VARIABLE

    server, environments = serve.server, serve.environments
    what = []
    if server is not None:
        options = server.options
        what.append(
            f"[green]NeMo-Gym mini_swe_agent_2 is serving[/green] ({options.sandbox} sandbox, "
            f"concurrency {options.concurrency})."
        )
    if environments is not None:
        names = ", ".join(
            f"{p.name} (port {environments.ports[p.instance]}"
            + (f", agent {p.agent} on port {environments.ports[p.agent]})" if p.agent else ")")
            for p in environments.plans
        )
        what.append(f"[green]NeMo-Gym environments are serving[/green]: {names}.")
        if environments.routed:
            what.append(
                "Agents' model calls are routed to the session of each /run's rollout, on "
                f"{', '.join(environments.session_servers)} only."
            )
    ray = ""
    if server is not None and server.options.ray_address:
        nodes = server.cluster_nodes
        cpus = sum(node.cpus for node in nodes)
        ray = f"Episodes run on the Ray cluster at {server.options.ray_address}: {len(nodes)} nodes, {cpus:g} CPUs.\n"
    console.print("\n".join(what) + f"\nReady in {took:.0f} s.\n{ray}On the training node:\n")
    if server is not None:
        console.print(f"    export NEMO_GYM_URL={server.advertised_url}", soft_wrap=True, highlight=False)
    if environments is not None:
        setting = shlex.quote(environments.setting())
        console.print(f"    export NEMO_GYM_ENVS={setting}", soft_wrap=True, highlight=False, markup=False)
    if environments is not None and environments.routed:
        # The one place the signing secret is shown: the trainer needs it (never logged, never in argv).
        if os.environ.get(SECRET_VARIABLE):
            console.print(f"    # and {SECRET_VARIABLE}: the value serve was started with (not shown)", highlight=False)
        else:
            console.print(
                f"    export {SECRET_VARIABLE}={environments.rollout_secret}",
                soft_wrap=True,
                highlight=False,
                markup=False,
            )
    logs = []
    if server is not None:
        logs.append(f"log: {server.log_path}\nresults: {server.state_dir}/results")
    if environments is not None:
        logs.append(f"environments' logs: {environments.state_dir}/<name>.log")
    console.print("\n" + "\n".join(logs) + "\nPress Ctrl-C to stop.", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("serve", help=_HELP)(serve)
