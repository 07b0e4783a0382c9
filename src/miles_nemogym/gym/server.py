"""The real NeMo-Gym ``mini_swe_agent_2`` server as a child process (docs/data-and-checks.md, "Running the server")."""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from miles_nemogym.gym._logs import ServerLog, log_tail, run_secrets
from miles_nemogym.gym._providers import missing, node_binaries, redacted
from miles_nemogym.gym.cluster import ClusterNode, check_cluster
from miles_nemogym.gym.config import ServeOptions, compose_config_yaml, planned_config
from miles_nemogym.gym.venv import GymEnvironmentError, GymVenv, Progress, child_environment, ensure_gym_venv
from miles_nemogym.transport import bracket, connect_host, is_wildcard

__all__ = ["GymServer"]

MARKER_ENV = "MILES_NEMOGYM_GYM_SERVER_ID"
"""Set in the server's environment; inherited by Ray, so stragglers can be found."""

# Unix socket paths stay below ~107 bytes: Ray's sockets go ~70 bytes below RAY_TMPDIR (past the limit its
# dashboard fails after 60 s), so a longer state folder gets a short temp folder, removed on stop.
_MAX_SOCKET_BASE = 32


class GymServerError(GymEnvironmentError):
    """The server did not start, or died; the message carries its log tail."""


_T = TypeVar("_T")


def _started(value: _T | None) -> _T:
    if value is None:
        raise GymServerError("the server is not started")
    return value


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 20000  # above Ray's default worker ports (10002-19999) and the well-known ones
_pick = random.Random()  # a private generator: a test seeding ``random`` does not make servers collide


def _listen_ports() -> range:
    """Ports a server may take: below the OS's ephemeral range, where no outgoing connection takes one."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 49152, 65535  # the IANA range (macOS, BSD)
    return range(_LOWEST_PORT, low) if low - _LOWEST_PORT >= 1000 else range(high + 1, 65536)


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now, as uvicorn binds (``SO_REUSEADDR``: TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """A port on ``host`` that nothing holds now, outside the ephemeral range, and not one of ``avoid``."""
    bind_host = "127.0.0.1" if is_wildcard(host) else host.strip("[]")  # "[::1]" as a URL writes it
    ports = _listen_ports()
    for _ in range(100):
        port = _pick.choice(ports)
        if port not in avoid and port_free(bind_host, port):
            return port
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    while True:  # a crowded range: any port the OS gives
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((bind_host, 0))
            port = int(probe.getsockname()[1])
        if port not in avoid:
            return port


def planned_server(options: ServeOptions, state_dir: Path | None) -> tuple[dict[str, Any], list[str]]:
    """The server's config as ``serve`` would compose it, secrets hidden, and what its sandbox lacks here."""
    port = options.port or free_port(options.host)
    config = planned_config(options, port, state_dir.resolve() if state_dir else Path("<state-dir>"))
    return redacted(config), missing(options.sandbox, config)


def _default_route_address() -> str:
    """This machine's address on its default route (a UDP connect sends no packet)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only consults the routing table
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def pids_with_marker(marker: str) -> list[int]:
    """Processes (Linux ``/proc``) whose environment carries ``MARKER_ENV=marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found: list[int] = []
    for entry in Path("/proc").glob("[0-9]*"):  # none where there is no /proc
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def kill_marked(marker: str) -> None:
    """SIGKILL every process carrying ``MARKER_ENV=marker`` (e.g. Ray's daemons) until none is left or 5 s passed."""
    for _ in range(20):
        stragglers = pids_with_marker(marker)
        if not stragglers:
            return
        for pid in stragglers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.25)


def answers(url: str) -> bool:
    """True when ``GET url`` gets any HTTP answer: the server is serving."""
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return False  # nothing there yet, or something that is not an HTTP server (another's port)


def listens(pids: Iterable[int], port: int) -> bool | None:
    """Whether one of ``pids`` holds the socket listening on ``port``; None where Linux's ``/proc`` cannot tell."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not any(table.exists() for table in tables):
        return None
    wanted: set[str] = set()
    for table in tables:
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()
                # local_address is HEX_IP:HEX_PORT; state 0A is LISTEN.
                if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    wanted.add(f"socket:[{fields[9]}]")
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in wanted:
                        return True
    return False


def wait_until_answering(
    process: subprocess.Popen[bytes], host: str, port: int, marker: str, deadline: float, interval: float
) -> str | None:
    """Poll ``host:port`` until ``process`` answers (None), exits (``"exited"``) or ``deadline`` passes
    (``"timeout"``, or ``"another"`` when what listens there is neither it nor a process ``marker`` marks)."""
    stranger = False
    while True:
        if process.poll() is not None:
            return "exited"
        if answers(f"http://{connect_host(host)}:{port}/openapi.json"):
            stranger = listens([process.pid, *pids_with_marker(marker)], port) is False
            if not stranger and process.poll() is None:
                return None
        if time.monotonic() > deadline:
            return "another" if stranger else "timeout"
        time.sleep(interval)


def spawn(command: list[str], cwd: Path, env: Mapping[str, str], log: ServerLog) -> subprocess.Popen[bytes]:
    """Start ``command`` writing to ``log``, in its own process group: Ctrl-C in a terminal does not reach it
    directly, and :func:`terminate` signals it and its children (Ray) as one."""
    try:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log.child_end,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.started()


def terminate(processes: Iterable[subprocess.Popen[bytes]], marker: str, timeout: float) -> None:
    """SIGTERM each process' group, SIGKILL what is left after ``timeout``, then every process ``marker`` marks."""
    processes = list(processes)
    for process in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        # The leader may be gone while Ray daemons in its group or elsewhere live on.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
    kill_marked(marker)


def advertised_url(host: str, port: int) -> str:
    """The URL other machines reach a server bound to ``host`` by (the routed address for a wildcard)."""
    shown = bracket(_default_route_address()) if is_wildcard(host) else connect_host(host)
    return f"http://{shown}:{port}"


class GymServer:
    """The ``mini_swe_agent_2`` server as a context manager; ``state_dir`` (default: a temp folder) is kept."""

    def __init__(
        self,
        options: ServeOptions | None = None,
        *,
        state_dir: Path | None = None,
        venv: GymVenv | None = None,
        progress: Progress | None = None,
        start_timeout: float = 240.0,
    ) -> None:
        self.options = options or ServeOptions()
        self._given_state_dir = state_dir
        self._venv = venv
        self._progress = progress
        self.start_timeout = start_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: ServerLog | None = None
        self._marker = uuid.uuid4().hex
        self._short_tmp: Path | None = None
        self._lock = threading.Lock()
        self.state_dir: Path | None = None
        self.port: int | None = None
        self.config_yaml: str | None = None
        self.cluster_nodes: list[ClusterNode] = []
        """The joined cluster's nodes (``ray_address``), as checked at start."""

    @property
    def url(self) -> str:
        """``http://<host>:<port>`` as a client on this machine dials it."""
        return f"http://{connect_host(self.options.host)}:{_started(self.port)}"

    @property
    def advertised_url(self) -> str:
        """The ``NEMO_GYM_URL`` to give trainers (see :func:`advertised_url`)."""
        return advertised_url(self.options.host, _started(self.port))

    @property
    def log_path(self) -> Path:
        return _started(self.state_dir) / "server.log"

    @property
    def results_dir(self) -> Path:
        """Where the server writes each episode's results (``<subset>/<policy model name>/<instance_id>/``)."""
        return _started(self.state_dir) / "results"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _environment(self, state: Path, config_yaml: str) -> dict[str, str]:
        base = state
        if len(str(state)) > _MAX_SOCKET_BASE:
            # Removed by stop(), after the server: a TemporaryDirectory's exit hook could run before _stop_all.
            self._short_tmp = base = Path(tempfile.mkdtemp(prefix="mng-", dir="/tmp"))
        tmp, ray_tmp = base / "tmp", base / "ray"
        tmp.mkdir(parents=True, exist_ok=True)
        ray_tmp.mkdir(parents=True, exist_ok=True)
        env = {
            **child_environment(),
            "NEMO_GYM_CONFIG_DICT": config_yaml,
            "NEMO_GYM_CONFIG_PATH": self.options.instance_name,
            "PYTHONPATH": str(_started(self._venv).agent_dir),
            "PYTHONUNBUFFERED": "1",
            MARKER_ENV: self._marker,
            # Ray: no usage report, own temp; a private Ray is on loopback with no
            # auth tokens to manage (a joined cluster keeps the caller's RAY_AUTH_MODE).
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TMPDIR": str(ray_tmp),
            "TMPDIR": str(tmp),
            "TEMP": str(tmp),
            "TMP": str(tmp),
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": str(state / "mswea"),
            # litellm would otherwise fetch its model price map from the internet.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            # Nothing at run time may install packages behind the user's back.
            "PIP_NO_INDEX": "1",
        }
        if not self.options.ray_address:
            env["RAY_AUTH_MODE"] = "disabled"
        if self.options.sandbox == "local":
            home = state / "home"
            xdg = {"CONFIG": ".config", "CACHE": ".cache", "DATA": ".local/share", "STATE": ".local/state"}
            folders = {"HOME": home, **{f"XDG_{name}_HOME": home / sub for name, sub in xdg.items()}}
            for folder in folders.values():
                folder.mkdir(parents=True, exist_ok=True)
            env |= {name: str(folder) for name, folder in folders.items()}
            env["GIT_CONFIG_GLOBAL"] = str(home / ".gitconfig")
        return env

    def start(self) -> GymServer:
        """Build/reuse the venv, compose the config, start, and wait until it answers."""
        with self._lock:
            if self._process is not None:
                raise GymServerError("this GymServer is already started")
            if self._venv is None:
                self._venv = ensure_gym_venv(self.options.sandbox, progress=self._progress)
            state = (self._given_state_dir or Path(tempfile.mkdtemp(prefix="mng-gym-"))).resolve()
            self.state_dir = state
            self.port = self.options.port or free_port(self.options.host)
            self.config_yaml = compose_config_yaml(self.options, self._venv, self.port, state)
            env = self._environment(state, self.config_yaml)
            try:
                if self.options.ray_address:
                    if self._progress:
                        self._progress(f"checking the Ray cluster at {self.options.ray_address}")
                    binaries = node_binaries(self.options.sandbox, yaml.safe_load(self.config_yaml))
                    self.cluster_nodes = check_cluster(
                        self.options.ray_address, self._venv, state, env, binaries=binaries
                    )
                self._log = ServerLog(self.log_path, run_secrets())
            except BaseException:
                self._remove_short_tmp()
                raise
            command = [str(self._venv.python), str(self._venv.agent_dir / "app.py")]
            self._process = spawn(command, state, env, self._log)
            _LIVE.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        process, deadline = _started(self._process), time.monotonic() + self.start_timeout
        failed = wait_until_answering(process, self.options.host, _started(self.port), self._marker, deadline, 0.5)
        if failed is None:
            return
        log = log_tail(self.log_path, 60)
        if failed == "exited":
            raise GymServerError(f"the NeMo-Gym server exited during start (exit {process.returncode}); log {log}")
        if failed == "another":
            raise GymServerError(
                f"another program answers on {self.url}, not the NeMo-Gym server serve started (still not "
                f"listening after {self.start_timeout:.0f} s); stop that program or give another --port. Log {log}"
            )
        raise GymServerError(
            f"the NeMo-Gym server did not answer on {self.url} within {self.start_timeout:.0f} s; log {log}"
        )

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the server's process group, SIGKILL what is left; idempotent."""
        with self._lock:
            if self._process is None:
                return
            terminate([self._process], self._marker, timeout)
            if self._log is not None:
                self._log.close()
            self._remove_short_tmp()
            _LIVE.discard(self)

    def _remove_short_tmp(self) -> None:
        if self._short_tmp is not None:
            shutil.rmtree(self._short_tmp, ignore_errors=True)
            self._short_tmp = None

    def __enter__(self) -> GymServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_LIVE: set[GymServer] = set()


@atexit.register
def _stop_all() -> None:
    """A caller that forgot ``stop`` (or crashed) still leaves no server behind."""
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop(timeout=5)
