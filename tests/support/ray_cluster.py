"""A real multi-node Ray cluster on this machine, started from the server environment's ``ray``.

Each node is a ``ray start --block`` process in its own session with its own free ports,
all under one short temp folder (Ray's socket paths must stay below ~107 bytes, so not
pytest's long ``tmp_path``), which also holds the nodes' HOME: nothing lands in the
defaults other tests share (``/tmp/ray``, ``~``). Teardown ends exactly the processes
carrying this cluster's marker variable; never ``ray stop``, which ends every Ray on
the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from miles_nemogym.gym.venv import GymVenv
from tests.support.ports import free_port

MARKER = "MILES_NEMOGYM_TEST_RAY_CLUSTER"


def pids_with_environment(text: str) -> list[int]:
    """Processes (Linux ``/proc``) whose environment contains ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text.encode() in (proc / "environ").read_bytes():
                    found.append(int(proc.name))
    return found


# Ports every node opens; left to Ray, two nodes on one machine collide on the fixed defaults.
_NODE_PORTS = (
    "--node-manager-port",
    "--object-manager-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
)

# What serve gives the episodes of its private Ray, given here to the nodes' Ray instead:
# a joined cluster's tasks get the node's environment, not serve's (docs/scale-out.md).
_EPISODE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "MSWEA_SILENT_STARTUP": "1",
    "PIP_NO_INDEX": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


class RayCluster:
    """``with RayCluster(venv) as cluster: cluster.start_head(); cluster.add_node(...)``."""

    def __init__(self, venv: GymVenv, start_timeout: float = 240.0) -> None:
        self.venv = venv
        self.start_timeout = start_timeout
        self.base = Path(tempfile.mkdtemp(prefix="mngr-", dir="/tmp"))
        self.marker = uuid.uuid4().hex
        self.address = ""
        self.dashboard_url = ""
        self._processes: list[subprocess.Popen[bytes]] = []
        self._nodes = 0

    def _environment(self, label: str) -> dict[str, str]:
        dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RAY_ADDRESS")
        env = {k: v for k, v in os.environ.items() if k not in dropped}
        home = self.base / "home"
        home.mkdir(exist_ok=True)
        env.update(_EPISODE_ENV)
        # TMPDIR too: Ray's dashboard starts multiprocessing's forkserver, whose pymp-* folder a
        # stopped node leaves behind; in the cluster's folder it goes when the test's does.
        env.update({"HOME": str(home), "RAY_TMPDIR": str(self.base), "TMPDIR": str(self.base)})
        env[MARKER] = f"{self.marker}-{label}"
        return env

    def _start(self, name: str, arguments: list[str], attempts: int = 3) -> None:
        """``ray start`` for one node; retried, because Ray gives a new node a fixed 30 s to register
        with the head, which a loaded machine can miss (the failed attempt's processes are ended)."""
        problem = ""
        for attempt in range(1, attempts + 1):
            label = f"{name}-{attempt}"
            problem = self._try_start(label, arguments)
            if not problem:
                return
            self._end(f"{MARKER}={self.marker}-{label}")
        raise RuntimeError(problem)

    def _try_start(self, label: str, arguments: list[str]) -> str:
        command = [str(self.venv.path / "bin" / "ray"), "start", "--block", "--disable-usage-stats"]
        command += ["--node-ip-address", "127.0.0.1", "--temp-dir", str(self.base), *arguments]
        for flag in _NODE_PORTS:
            command += [flag, str(free_port())]
        log_path = self.base / f"{label}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                command,
                env=self._environment(label),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._processes.append(process)
        deadline = time.monotonic() + self.start_timeout
        while "Ray runtime started" not in log_path.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                return f"ray start ({label}) did not come up:\n{log_path.read_text(errors='replace')[-3000:]}"
            time.sleep(0.5)
        return ""

    def start_head(self, num_cpus: int) -> None:
        port, dashboard = free_port(), free_port()
        self._start(
            "head",
            [
                "--head", "--port", str(port), "--num-cpus", str(num_cpus),
                "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
                "--ray-client-server-port", str(free_port()),
            ],
        )  # fmt: skip
        self.address = f"127.0.0.1:{port}"
        self.dashboard_url = f"http://127.0.0.1:{dashboard}"

    def add_node(self, num_cpus: int, resources: dict[str, float]) -> None:
        self._nodes += 1
        self._start(
            f"node{self._nodes}",
            ["--address", self.address, "--num-cpus", str(num_cpus), "--resources", json.dumps(resources)],
        )

    def state(self) -> dict[str, Any]:
        """The alive nodes and every task, from Ray's state API (the head's dashboard)."""
        script = (
            "import json, sys\n"
            "from ray.util.state import list_nodes, list_tasks\n"
            "url = sys.argv[1]\n"
            "nodes = [{'id': n.node_id, 'state': n.state, 'resources': n.resources_total}"
            " for n in list_nodes(address=url, limit=1000)]\n"
            "tasks = [{'name': t.func_or_class_name, 'state': t.state, 'node_id': t.node_id}"
            " for t in list_tasks(address=url, limit=10000, raise_on_missing_output=False)]\n"
            "print(json.dumps({'nodes': nodes, 'tasks': tasks}))\n"
        )
        done = subprocess.run(
            [str(self.venv.python), "-c", script, self.dashboard_url],
            capture_output=True,
            text=True,
            env=self._environment("query"),
            timeout=180,
            check=True,
        )
        state: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return state

    def daemons(self) -> list[str]:
        """The names (``/proc/<pid>/comm``) of this cluster's running processes, sorted."""
        names = []
        for pid in pids_with_environment(f"{MARKER}={self.marker}"):
            with contextlib.suppress(OSError):
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        return sorted(names)

    def _end(self, marker: str) -> None:
        """SIGKILL every process whose environment carries ``marker``, until none is left."""
        for _ in range(40):
            left = pids_with_environment(marker)
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.25)

    def stop(self) -> None:
        for process in self._processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
        self._end(f"{MARKER}={self.marker}")
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
