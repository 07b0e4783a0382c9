"""What ``miles-nemogym serve`` runs (the SWE and ``--env`` servers): planned, checked, shown, started."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

from miles_nemogym.errors import redact_url
from miles_nemogym.gym import venv as gym_venv
from miles_nemogym.gym._logs import log_tail
from miles_nemogym.gym.cluster import unreachable
from miles_nemogym.gym.composition import Judge, judged_instances
from miles_nemogym.gym.config import ServeOptions
from miles_nemogym.gym.environments import (
    EnvironmentPlan,
    EnvironmentServers,
    environment_needs,
    missing_requirements,
    overlay_path,
    plan,
    plan_config,
    ready_python,
    refusals,
    setting,
)
from miles_nemogym.gym.server import GymServer, advertised_url, planned_server, port_free
from miles_nemogym.gym.venv import GymEnvironmentError, GymVenv, Progress, ensure_gym_venv
from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import (
    MIN_SECRET_CHARS,
    SECRET_VARIABLE,
    secret_problem,
)
from miles_nemogym.routing_root.responses_api_models.miles_routing_model.session_servers import parse_session_server

__all__ = ["Serve"]


def _requirements(plans: Sequence[EnvironmentPlan], gym: GymVenv | None) -> str:
    """The lines ``plans`` need beyond nemo-gym, and what the first serve does about them (``gym`` None: unbuilt)."""
    lines = sorted({line for p in plans for line in p.requirements})
    if not lines:
        return "none beyond nemo-gym"
    if gym is None:
        return f"{', '.join(lines)}; the ones the server environment lacks are installed on the first serve"
    needed = missing_requirements(gym, plans)
    if not needed:
        return f"{', '.join(lines)}, all in the server environment"
    link = overlay_path(gym, needed)
    if ready_python(link):
        return f"{', '.join(needed)} installed in {link} (cached)"
    return f"installs {', '.join(needed)} into {link} on the first serve (once)"


def _played(agents: Sequence[str]) -> str:
    verb = "is" if len(agents) == 1 else "are"
    return f"{', '.join(agents)} {verb} played by an agent server whose model calls go to"


class Serve:
    """One ``serve``: the SWE server on ``options.port``, ``envs`` on the ports after it; see :attr:`problems`."""

    def __init__(
        self,
        options: ServeOptions,
        envs: Sequence[str],
        *,
        swe: bool,
        routed: bool,
        judge: Judge | None,
        session_servers: Sequence[str],
        dry_run: bool,
    ) -> None:
        self.options, self.swe, self.judge = options, swe, judge
        self.session_servers = [server.strip() for server in session_servers if server.strip()]
        self.first_port = options.port + (1 if swe else 0) if options.port else 0
        self.plans: list[EnvironmentPlan] = []
        self.server: GymServer | None = None
        self.environments: EnvironmentServers | None = None
        self.started = 0.0
        """``time.monotonic()`` once the server venv was ready (what "Ready in" counts from)."""
        self._made: Path | None = None
        self.problems = self._problems(envs, routed, dry_run)
        """Why serve refuses the request, each a line after ``error:`` (none: go on)."""

    def _agents(self) -> list[str]:
        return [p.name for p in self.plans if p.agent]

    def _problems(self, envs: Sequence[str], routed: bool, dry_run: bool) -> list[str]:
        try:
            self.plans = plan(envs, routed=routed)
        except GymEnvironmentError as exc:
            return [f"--env: {exc}"]
        refused = [f"--env: {reason}" for reason in refusals(self.plans, self.judge)]
        if refused:
            return refused
        for entry in self.session_servers:
            try:
                parse_session_server(entry)
            except ValueError as exc:
                return [f"--session-server {entry!r}: {exc}"]
        agents = self._agents()
        if agents and not self.session_servers and not dry_run:
            return [
                f"{_played(agents)} the trainer's Miles session servers: name them with --session-server HOST:PORT "
                "(the training node's address and Miles' --session-server-port, e.g. --session-server 10.0.0.5:30000)"
            ]
        secret = os.environ.get(SECRET_VARIABLE)
        problem = secret_problem(secret) if agents and secret is not None else None
        if problem:
            return [
                f"{problem} (it signs the agents' rollout ids); unset it and serve makes one, or set at least "
                f"{MIN_SECRET_CHARS} random characters"
            ]
        if self.first_port and self.first_port + len(self.plans) - 1 > 65535:
            return [f"--port: {len(self.plans)} environments after port {self.options.port} pass 65535"]
        return []

    def dry_run(self, state_dir: Path | None) -> Iterator[tuple[str, str]]:
        """What ``--dry-run`` shows as (kind, text): ``config``, ``line``, ``value`` (unwrapped) or ``missing``."""
        options = self.options
        if self.swe:
            config, missing = planned_server(options, state_dir)
            yield (
                "config",
                f"# miles-nemogym serve --sandbox {options.sandbox} --dry-run: nothing was started.\n"
                "# The server config: nemo-gym's shipped configs and serve's options (secrets hidden).\n"
                + yaml.safe_dump(config, sort_keys=False),
            )
            yield from (("missing", line) for line in missing)
        venv = gym_venv.cached_gym_venv(options.sandbox if self.swe else "local")
        try:
            where = venv.path if venv else f"built on the first serve (2-5 minutes) with {gym_venv.find_gym_python()}"
            yield "line", f"server environment: {where}"
        except GymEnvironmentError as exc:
            yield "missing", str(exc).splitlines()[0]
        if self.swe and options.ray_address:
            refused = unreachable(options.ray_address)
            if refused:
                yield "missing", f"a Ray cluster at {options.ray_address} (cannot connect: {refused})"
            else:
                yield "line", f"Ray: joins {options.ray_address} (each node is checked when serve starts)"
        if not self.plans:
            return
        yield "line", "environments (each a resources server run from the server environment):"
        for index, p in enumerate(self.plans):
            steps = f", max_steps {p.max_steps}" if p.max_steps else ""
            where = f"port {self.first_port + index}" if self.first_port else "a free port"
            yield "line", f"  {p.name}: server {p.instance} from {p.config}, on {where}{steps}"
            if p.agent:
                yield "line", f"    played by agent {p.agent} (its /run), model calls through the routing model"
        requirements = _requirements(self.plans, venv)
        judged = [p.name for p in self.plans if judged_instances(plan_config(p))]
        free, host, first = f"http://{options.host}:<free port>", options.host, self.first_port
        urls = {p.name: advertised_url(host, first + i) if first else free for i, p in enumerate(self.plans)}
        yield "value", f"requirements: {requirements}"
        if self.judge is not None and judged:
            yield "value", f"judge: {', '.join(judged)} graded by {self.judge.model} at {redact_url(self.judge.url)}"
        yield "value", f"NEMO_GYM_ENVS='{setting(self.plans, urls, {p.name: free for p in self.plans if p.agent})}'"
        yield from (("missing", need) for need in environment_needs(self.plans, self.judge))
        agents = self._agents()
        if agents and not self.session_servers:
            said = f"{_played(agents)} the trainer's Miles session servers (the training nodes' address)"
            yield "missing", f"--session-server HOST:PORT: {said}"

    def refusal(self, state_dir: Path | None, *, anyway: bool) -> tuple[int, str] | None:
        """Why nothing may start and the exit code (2 a taken port or bad config, 1 a lack); None: start."""
        options, fix = self.options, "pass --start-anyway (e.g. when it comes later). Nothing was started."
        ports = [options.port] if self.swe and options.port else []
        ports += range(self.first_port, self.first_port + len(self.plans)) if self.first_port else []
        taken = [port for port in ports if not port_free(options.host, port)]
        if taken:
            return 2, (
                f"--port: {', '.join(map(str, taken))} on {options.host} {'is' if len(taken) == 1 else 'are'} taken "
                "(another serve, or another program, listens there); give another --port, or --port 0 for free "
                "ports. Nothing was started."
            )
        if self.swe and not anyway:
            try:
                missing = planned_server(options, state_dir)[1]
            except GymEnvironmentError as exc:
                return 2, str(exc)
            if missing:
                said = "".join(f"\n  - {line}" for line in missing)
                return 1, (
                    f"the {options.sandbox} sandbox cannot run episodes here; it lacks:{said}\n"
                    f"Provide it, choose another --sandbox, or {fix}"
                )
        lacking = environment_needs(self.plans, self.judge) if self.plans and not anyway else []
        if lacking:  # what --dry-run reports: a server started without it fails, or never plays an episode
            said = "".join(f"\n  - {line}" for line in lacking)
            return 1, f"the environments' servers cannot run here; they lack:{said}\nProvide it, or {fix}"
        return None

    def start(self, state_dir: Path | None, progress: Progress, start_timeout: float) -> None:
        """Build the server venv and start every server, stopping all on a failure (state: :meth:`keep`)."""
        state = (state_dir or Path(tempfile.mkdtemp(prefix="mng-gym-"))).resolve()
        self._made = None if state_dir else state
        try:
            venv = ensure_gym_venv(self.options.sandbox if self.swe else "local", progress=progress)
            self.started = time.monotonic()
            if self.plans:  # one state folder for every server: the environments' logs in its environments/
                self.environments = EnvironmentServers(
                    venv,
                    self.plans,
                    state_dir=state / "environments",
                    host=self.options.host,
                    first_port=self.first_port,
                    progress=progress,
                    start_timeout=start_timeout,
                    judge=self.judge,
                    session_servers=self.session_servers,
                )
                self.environments.compose()  # nemo-gym's parser refuses a config before anything starts
            if self.swe:
                where = f"{self.options.host}:{self.options.port or 'a free port'}"
                progress(f"starting NeMo-Gym {self.options.sandbox} server on {where}")
                self.server = GymServer(
                    self.options, state_dir=state, venv=venv, progress=progress, start_timeout=start_timeout
                )
                self.server.start()
            if self.environments is not None:
                self.environments.start()
        except BaseException:
            self.stop()
            raise

    def wait(self) -> list[tuple[str, str]]:
        """Until a server exits: each that did, as (its name, its log's path and tail)."""
        server, envs = self.server, self.environments
        while (server is None or server.is_running()) and (envs is None or not envs.exited()):
            time.sleep(1.0)
        exited = []
        if server is not None and not server.is_running():
            exited.append(("the server", log_tail(server.log_path, 60)))
        if envs is not None:
            exited += [(name, envs.log_tail(name)) for name in envs.exited()]
        return exited

    def stop(self) -> None:
        """Stop every server started; idempotent."""
        if self.environments is not None:
            self.environments.stop()
        if self.server is not None:
            self.server.stop()

    def keep(self) -> Path | None:
        """After a failure: serve's own state folder if any file in it holds anything, else removed (None)."""
        made = self._made
        if made is not None and any(path.is_file() and path.stat().st_size for path in made.rglob("*")):
            self._made = None
            return made
        self.remove()
        return None

    def remove(self) -> Path | None:
        """Remove serve's own state folder (rmtree unlinks a link in it, never follows it); which, if any."""
        made, self._made = self._made, None
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        return made
