"""``miles-nemogym serve``: the NeMo-Gym environment side in one command."""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from miles_nemogym.cli._console import fail, interrupt_on_signals
from miles_nemogym.cli._options import JUDGE_MODEL_HELP, JUDGE_URL_HELP, SANDBOXES, judge_of

if TYPE_CHECKING:
    from rich.console import Console

    from miles_nemogym.gym.composition import Judge
    from miles_nemogym.gym.config import ServeOptions
    from miles_nemogym.gym.environments import EnvironmentPlan, EnvironmentServers
    from miles_nemogym.gym.server import GymServer
    from miles_nemogym.gym.venv import GymVenv

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
    from miles_nemogym.gym.config import ServeOptions, load_provider_options
    from miles_nemogym.gym.environments import EnvironmentServers, environment_needs, plan, refusals
    from miles_nemogym.gym.server import GymServer, planned_server
    from miles_nemogym.gym.venv import GymEnvironmentError, ensure_gym_venv
    from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import (
        MIN_SECRET_CHARS,
        SECRET_VARIABLE,
        secret_problem,
    )
    from miles_nemogym.routing_root.responses_api_models.miles_routing_model.session_servers import parse_session_server

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
                "provider_options": load_provider_options(provider_config) if provider_config else {},
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
    try:
        plans = plan(envs or [], routed=routed)
    except GymEnvironmentError as exc:
        fail(console, f"[red]error:[/red] --env: {escape(str(exc))}", highlight=False)
    refused = refusals(plans, judge)
    for reason in refused:
        console.print(f"[red]error:[/red] --env: {escape(reason)}", highlight=False)
    if refused:
        raise typer.Exit(2)
    agents = [p.name for p in plans if p.agent]
    allowed = [server.strip() for server in session_servers or [] if server.strip()]
    for entry in allowed:
        try:
            parse_session_server(entry)
        except ValueError as exc:
            fail(console, f"[red]error:[/red] --session-server {escape(entry)!r}: {exc}", highlight=False)
    if agents and not allowed and not dry_run:
        fail(
            console,
            f"[red]error:[/red] {', '.join(agents)} {'is' if len(agents) == 1 else 'are'} played by an agent server "
            "whose model calls go to the trainer's Miles session servers: name them with --session-server HOST:PORT "
            "(the training node's address and Miles' --session-server-port, e.g. --session-server 10.0.0.5:30000)",
            highlight=False,
        )
    given_secret = os.environ.get(SECRET_VARIABLE)
    if agents and given_secret is not None and secret_problem(given_secret):
        fail(
            console,
            f"[red]error:[/red] {secret_problem(given_secret)} (it signs the agents' rollout ids); unset it and "
            f"serve makes one, or set at least {MIN_SECRET_CHARS} random characters",
            highlight=False,
        )
    # SWE on --port, the environments on the ports after it (0: every one free).
    first_port = options.port + (1 if swe else 0) if options.port else 0
    if first_port and first_port + len(plans) - 1 > 65535:
        fail(console, f"[red]error:[/red] --port: {len(plans)} environments after port {options.port} pass 65535")

    if dry_run:
        try:
            code = _dry_run(
                options,
                state_dir,
                console,
                swe=swe,
                plans=plans,
                first_port=first_port,
                judge=judge,
                session_servers=allowed,
            )
        except GymEnvironmentError as exc:
            fail(console, f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(code)
    taken = _taken_ports(options.host, ([options.port] if swe and options.port else []), first_port, len(plans))
    if taken:
        fail(
            console,
            f"[red]error:[/red] --port: {', '.join(map(str, taken))} on {options.host} "
            f"{'is' if len(taken) == 1 else 'are'} taken (another serve, or another program, listens there); "
            "give another --port, or --port 0 for free ports. Nothing was started.",
            highlight=False,
        )
    if swe and not start_anyway:
        try:
            _, missing = planned_server(options, state_dir)
        except GymEnvironmentError as exc:
            fail(console, f"[red]error:[/red] {escape(str(exc))}")
        if missing:
            console.print(f"[red]error:[/red] the {options.sandbox} sandbox cannot run episodes here; it lacks:")
            for line in missing:
                console.print(f"  - {escape(line)}", highlight=False)
            fail(
                console,
                "Provide it, choose another --sandbox, or pass --start-anyway (e.g. when it comes later). "
                "Nothing was started.",
                1,
                highlight=False,
            )
    lacking = environment_needs(plans, judge) if plans and not start_anyway else []
    if lacking:  # what --dry-run reports: a server started without it fails, or never plays an episode
        console.print("[red]error:[/red] the environments' servers cannot run here; they lack:")
        for line in lacking:
            console.print(f"  - {escape(line)}", highlight=False)
        fail(console, "Provide it, or pass --start-anyway (e.g. when it comes later). Nothing was started.", 1)
    if swe and options.sandbox == "local":
        console.print(
            "[yellow]--sandbox local runs the agent's commands on this host without isolation, and "
            "grading without the task containers cannot resolve instances (reward 0.0). Use a container "
            "provider (e.g. --sandbox docker on a Docker host) for real training.[/yellow]"
        )
    if swe and options.golden:
        console.print("[yellow]golden mode: no model calls; each /run applies the instance's gold patch.[/yellow]")

    with interrupt_on_signals(ctrl_c=True):
        server: GymServer | None = None
        environments: EnvironmentServers | None = None
        # serve's own temp state folder is removed on stop; a --state-dir (or one kept after a failure) stays.
        made = None if state_dir else Path(tempfile.mkdtemp(prefix="mng-gym-")).resolve()
        try:
            with step_display(console) as progress:
                venv = ensure_gym_venv(options.sandbox if swe else "local", progress=progress)
                # One state folder for every server: the environments' logs go in its environments/.
                state = state_dir.resolve() if state_dir else made
                started = time.monotonic()
                if state is not None and plans:
                    environments = EnvironmentServers(
                        venv,
                        plans,
                        state_dir=state / "environments",
                        host=options.host,
                        first_port=first_port,
                        progress=progress,
                        start_timeout=start_timeout,
                        judge=judge,
                        session_servers=allowed,
                    )
                    environments.compose()  # nemo-gym's parser refuses a config before anything starts
                if swe:
                    where = f"{options.host}:{options.port or 'a free port'}"
                    progress(f"starting NeMo-Gym {options.sandbox} server on {where}")
                    server = GymServer(
                        options, state_dir=state, venv=venv, progress=progress, start_timeout=start_timeout
                    )
                    server.start()
                if environments is not None:
                    environments.start()
        except GymEnvironmentError as exc:
            _stop(server, environments)
            console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)  # it quotes the log
            _keep(made, console)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            _stop(server, environments)
            _remove(made)
            fail(console, "interrupted; nothing left running.", 130)
        except BaseException:
            _stop(server, environments)
            _keep(made, console)
            raise

        try:
            _print_ready(console, server, environments, time.monotonic() - started)
            while (server is None or server.is_running()) and (environments is None or not environments.exited()):
                time.sleep(1.0)
            if server is not None and not server.is_running():
                tail = escape(f"{server.log_path}:\n{server.log_tail()}")
                console.print(f"[red]the server exited unexpectedly[/red]; log {tail}", highlight=False)
            for name in environments.exited() if environments else []:
                assert environments is not None
                console.print(
                    f"[red]{name} exited unexpectedly[/red]; log "
                    + escape(f"{environments.log_path(name)}:\n{environments.log_tail(name)}"),
                    highlight=False,
                )
            _keep(made, console)
            made = None
            raise typer.Exit(1)
        except KeyboardInterrupt:
            joined = options.ray_address is not None
            ray = "" if server is None else " (the Ray cluster keeps running)" if joined else " and its Ray"
            console.print(f"stopping the servers{ray}...")
        finally:
            _stop(server, environments)
    _remove(made)
    console.print("stopped." if made is None else f"stopped; removed {made}.", highlight=False)


def as_flag(loc: Sequence[int | str]) -> str:
    """Name a field by the command-line flag that sets it (``step_limit`` → ``--step-limit``)."""
    return "--" + "-".join(str(part) for part in loc).replace("_", "-")


def _taken_ports(host: str, swe: list[int], first_port: int, environments: int) -> list[int]:
    """Of the ports serve will bind (the SWE server's, then the environments' after it), those
    taken now, checked as the servers' own bind does, before anything starts."""
    from miles_nemogym.gym.server import port_free

    wanted = [*swe, *(range(first_port, first_port + environments) if first_port else [])]
    return [port for port in wanted if not port_free(host, port)]


def _remove(made: Path | None) -> None:
    """serve's own temp state folder (rmtree unlinks a link in it, never follows it)."""
    import shutil

    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


def _keep(made: Path | None, console: Console) -> None:
    """After a failure: serve's own state folder stays for its logs, removed when no file in it holds anything."""
    if made is None:
        return
    if any(path.is_file() and path.stat().st_size for path in made.rglob("*")):
        console.print(f"kept {made} (the logs) to look at; remove it when done", highlight=False, soft_wrap=True)
    else:
        _remove(made)


def _stop(server: GymServer | None, environments: EnvironmentServers | None) -> None:
    if environments is not None:
        environments.stop()
    if server is not None:
        server.stop()


def _print_ready(
    console: Console, server: GymServer | None, environments: EnvironmentServers | None, took: float
) -> None:
    """What is serving and the lines to paste on the training node (never wrapped)."""
    import shlex

    from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import SECRET_VARIABLE

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
    ray = _ray_line(server) if server is not None else ""
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


def _ray_line(server: GymServer) -> str:
    if not server.options.ray_address:
        return ""
    nodes = server.cluster_nodes
    cpus = sum(node.cpus for node in nodes)
    return f"Episodes run on the Ray cluster at {server.options.ray_address}: {len(nodes)} nodes, {cpus:g} CPUs.\n"


def _dry_run(
    options: ServeOptions,
    state_dir: Path | None,
    console: Console,
    *,
    swe: bool,
    plans: list[EnvironmentPlan],
    first_port: int,
    judge: Judge | None,
    session_servers: list[str],
) -> int:
    """Print the composed SWE config (stdout), the environments' plan and what is missing
    (stderr); 1 when something is."""
    import yaml
    from rich.markup import escape

    from miles_nemogym.gym.cluster import unreachable
    from miles_nemogym.gym.environments import environment_needs
    from miles_nemogym.gym.server import planned_server
    from miles_nemogym.gym.venv import GymEnvironmentError, planned_venv

    missing: list[str] = []
    if swe:
        config, missing = planned_server(options, state_dir)
        print(f"# miles-nemogym serve --sandbox {options.sandbox} --dry-run: nothing was started.")
        print("# The server config: nemo-gym's shipped configs and serve's options (secrets hidden).")
        print(yaml.safe_dump(config, sort_keys=False), end="")
    try:
        venv, where = planned_venv(options.sandbox if swe else "local")
        console.print(f"server environment: {escape(where)}", highlight=False)
    except GymEnvironmentError as exc:
        venv = None
        missing.append(str(exc).splitlines()[0])
    if swe and options.ray_address:
        refused = unreachable(options.ray_address)
        if refused:
            missing.append(f"a Ray cluster at {options.ray_address} (cannot connect: {refused})")
        else:
            console.print(f"Ray: joins {options.ray_address} (each node is checked when serve starts)", highlight=False)
    if plans:
        _plan_environments(plans, options.host, first_port, venv, console, judge)
        missing += environment_needs(plans, judge)
        agents = [p.name for p in plans if p.agent]
        if agents and not session_servers:
            missing.append(
                f"--session-server HOST:PORT: {', '.join(agents)} "
                f"{'is' if len(agents) == 1 else 'are'} played by an agent server whose model calls go to "
                "the trainer's Miles session servers (the training nodes' address)"
            )
    what = f"the {options.sandbox} sandbox" if swe else "the environments"
    if not missing:
        console.print(f"[green]nothing missing for {what}.[/green]")
        return 0
    console.print(f"[red]missing for {what}:[/red]")
    for line in missing:
        console.print(f"  - {escape(line)}", highlight=False)
    return 1


def _plan_environments(
    plans: list[EnvironmentPlan],
    host: str,
    first_port: int,
    venv: GymVenv | None,
    console: Console,
    judge: Judge | None,
) -> None:
    """Which resources servers would start where, what they would install, and the setting."""
    from miles_nemogym.errors import redact_url
    from miles_nemogym.gym.environments import planned_start

    console.print("environments (each a resources server run from the server environment):", highlight=False)
    for index, p in enumerate(plans):
        steps = f", max_steps {p.max_steps}" if p.max_steps else ""
        where = f"port {first_port + index}" if first_port else "a free port"
        console.print(f"  {p.name}: server {p.instance} from {p.config}, on {where}{steps}", highlight=False)
        if p.agent:
            console.print(
                f"    played by agent {p.agent} (its /run), model calls through the routing model", highlight=False
            )
    planned = planned_start(plans, host, first_port, venv)
    console.print(f"requirements: {planned.requirements}", highlight=False, soft_wrap=True)
    if judge is not None and planned.judged:
        console.print(
            f"judge: {', '.join(planned.judged)} graded by {judge.model} at {redact_url(judge.url)}",
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"NEMO_GYM_ENVS='{planned.setting}'", highlight=False, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("serve", help=_HELP)(serve)
