"""The launcher's Ray side for real: head start and stop, job submission, logs, exit code.

Needs ``ray[default]``, which the test extra installs. The head uses its own ports and temp folder and
binds the node address only; stopping it must leave no process behind (the launcher
stops only the head it started, never every Ray on the node).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from miles_nemogym.launcher import _command as cmd
from miles_nemogym.launcher._config import LauncherConfig
from miles_nemogym.launcher.run import RayActions
from tests.support.ports import free_port as any_free_port

pytestmark = pytest.mark.ray  # a slow tier: left out of `-m "not integration"` (tests/support/tiers.py)

WORKER_PORTS = range(15000, 16000)  # below the picked ports, off the ephemeral range


def free_port() -> int:
    """A free port outside the workers' range, which Ray refuses to share with a component."""
    while (port := any_free_port()) in WORKER_PORTS:
        pass
    return port


def ray_log_tails(ray_tmp: Path) -> str:
    """The last lines of the head's component logs, for a head that did not come up."""
    logs = sorted((ray_tmp / "session_latest" / "logs").glob("*.err")) + sorted(
        (ray_tmp / "session_latest" / "logs").glob("*.log")
    )
    return "\n".join(f"{log.name}: {log.read_text(errors='replace')[-600:]}" for log in logs[:12])


JOB_CODE = (
    "import os, sys; print('job sees', os.environ['NEMO_GYM_URL'], len(os.environ['NEMO_GYM_POLICY_API_KEY'])); "
    "print('job runs in', os.getcwd()); sys.exit(int(sys.argv[1]))"
)


@pytest.fixture
def head(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[RayActions, str]]:
    # Ray's socket paths must stay under 108 bytes: pytest's tmp_path is too deep.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rl-", dir="/tmp"))
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))
    # And multiprocessing's: the dashboard's forkserver folder outlives a stopped head.
    monkeypatch.setenv("TMPDIR", str(ray_tmp))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    # Every port the head opens is free-picked: another Ray (a NeMo-Gym server's) may run here.
    ports = [
        f"--{name}={free_port()}"
        for name in (
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "metrics-export-port",
            "runtime-env-agent-port",
            "node-manager-port",
            "object-manager-port",
            "ray-client-server-port",
        )
    ]
    config = LauncherConfig(
        master_addr="127.0.0.1",
        ray_port=free_port(),
        ray_dashboard_port=free_port(),
        ray_start_args=[
            *ports,
            f"--min-worker-port={WORKER_PORTS.start}",
            f"--max-worker-port={WORKER_PORTS.stop - 1}",
            "--num-cpus=2",
        ],
    )
    address = f"http://127.0.0.1:{config.ray_dashboard_port}"
    actions = RayActions()
    assert not actions.ray_reachable(address)
    # Started in a folder of its own, as a head reused from an earlier shell would be.
    started_in = tmp_path / "head started here"
    started_in.mkdir()
    with monkeypatch.context() as scope:
        scope.chdir(started_in)
        actions.start_ray_head(config)
    try:
        # A loaded 2-core machine has taken over 120 s to bring the head's dashboard up.
        deadline = time.monotonic() + 300
        while not actions.ray_reachable(address):
            exit_code = actions.ray_head_exit()
            assert exit_code is None, f"the Ray head exited ({exit_code}):\n{ray_log_tails(ray_tmp)}"
            assert time.monotonic() < deadline, f"the Ray head never answered:\n{ray_log_tails(ray_tmp)}"
            time.sleep(1)
        yield actions, address
    finally:
        actions.stop_ray_head()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not actions.ray_reachable(address)


@pytest.mark.timeout(600)
def test_jobs_run_with_their_environment_and_exit_codes_in_the_launchers_folder(
    head: tuple[RayActions, str], capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    actions, address = head
    launched_in = tmp_path / "launched from here"
    launched_in.mkdir()
    env = {"NEMO_GYM_URL": "http://gym:12000", "NEMO_GYM_POLICY_API_KEY": "sk-123456"}
    for job_exit, launcher_exit in ((0, 0), (3, 1)):
        argv = ["python3", "-c", JOB_CODE, str(job_exit)]
        job = cmd.Job(argv, env, frozenset({"NEMO_GYM_POLICY_API_KEY"}), cwd=launched_in)
        assert actions.submit(job, address, f"test-{job_exit}-{os.getpid()}-{time.time_ns()}") == launcher_exit
        out = capfd.readouterr().out
        assert "job sees http://gym:12000 9" in out  # the runtime env reached the job, logs streamed
        assert f"job runs in {launched_in}\n" in out  # not the folder the head was started in
        assert "sk-123456" not in out
