"""``serve --ray-address`` on a real two-node Ray cluster (docs/scale-out.md).

Both nodes run on this machine from the server environment's ``ray``; the second has a
resource of its own. Episodes sent to serve run as Ray tasks spread over the nodes (Ray's
task records name each task's node), and stopping serve leaves the cluster running.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.gym.venv import ensure_gym_venv
from miles_nemogym.testing.recording_policy import RecordingPolicy
from tests.support.gym_runs import assert_graded, post_run, run_body
from tests.support.ports import free_port
from tests.support.ray_cluster import RayCluster

pytestmark = pytest.mark.integration

# Three gradeable rows of the wheel, one episode each (distinct instances: this test is about
# where episodes run, not about a GRPO group).
INSTANCES = ("sympy__sympy-20916", "sphinx-doc__sphinx-8595", "scikit-learn__scikit-learn-14141")
EPISODE_TASK = "runner_ray_remote"  # the Ray task nemo-gym 0.7.0 runs each episode in


def _serve(cluster: RayCluster, state: Path) -> tuple[subprocess.Popen[str], str, str]:
    """``serve --ray-address`` started; returns it, its URL and what it printed until ready."""
    port = free_port()
    command = [sys.executable, "-m", "miles_nemogym.cli.main", "serve", "--sandbox", "local"]
    command += ["--port", str(port), "--concurrency", str(len(INSTANCES)), "--step-limit", "10"]
    command += ["--step-timeout", "120", "--eval-timeout", "600", "--state-dir", str(state)]
    command += ["--ray-address", cluster.address]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    seen: list[str] = []
    for line in process.stdout:
        seen.append(line)
        if "export NEMO_GYM_URL=" in line:
            break
    return process, f"http://127.0.0.1:{port}", "".join(seen)


def test_serve_spreads_episodes_over_a_running_cluster_and_leaves_it_running(
    tmp_path: Path, recording_policy: RecordingPolicy, gym_example_rows: list[dict[str, Any]]
) -> None:
    venv = ensure_gym_venv("local")
    with RayCluster(venv) as cluster:
        cluster.start_head(num_cpus=1)
        cluster.add_node(num_cpus=1, resources={"episode_node": 1})
        nodes = cluster.state()["nodes"]
        (second,) = [node["id"] for node in nodes if "episode_node" in node["resources"]]

        serve, url, printed = _serve(cluster, tmp_path / "serve-state")
        try:
            assert f"Episodes run on the Ray cluster at {cluster.address}: 2 nodes, 2 CPUs." in " ".join(
                printed.split()
            ), printed

            async def episodes() -> list[tuple[int, dict[str, Any]]]:
                return await asyncio.gather(
                    *(
                        post_run(url, run_body(gym_example_rows, iid, recording_policy.session_url(iid)))
                        for iid in INSTANCES
                    )
                )

            for (status, result), instance_id in zip(asyncio.run(episodes()), INSTANCES, strict=True):
                assert status == 200, result
                assert_graded(result, instance_id)
            serve.send_signal(signal.SIGTERM)
            rest, _ = serve.communicate(timeout=120)
        finally:
            if serve.poll() is None:
                serve.kill()
        assert serve.returncode == 0, rest
        assert "the Ray cluster keeps running" in rest

        state = cluster.state()
        episode_tasks = [task for task in state["tasks"] if task["name"] == EPISODE_TASK]
        assert [task["state"] for task in episode_tasks] == ["FINISHED"] * len(INSTANCES), episode_tasks
        assert second in {task["node_id"] for task in episode_tasks}, (second, episode_tasks)
        # Stopping serve ended its job, not the cluster.
        assert sorted(node["id"] for node in state["nodes"] if node["state"] == "ALIVE") == sorted(
            node["id"] for node in nodes
        )
