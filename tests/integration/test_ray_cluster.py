"""``serve --ray-address`` on a real two-node Ray cluster (docs/scale-out.md).

Both nodes run on this machine from the server environment's ``ray``; the second has a
resource of its own. Episodes sent to serve run as Ray tasks spread over the nodes (Ray's
task records name each task's node), and stopping serve leaves the cluster running.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.gym.venv import ensure_gym_venv
from miles_nemogym.smoke._policy import RecordingPolicy
from tests.support.gym_runs import assert_graded, post_run, run_body
from tests.support.ports import free_port
from tests.support.ray_cluster import RayCluster
from tests.support.serve_process import serving

pytestmark = pytest.mark.integration

# Three gradeable rows of the wheel, one episode each (distinct instances: this test is about
# where episodes run, not about a GRPO group).
INSTANCES = ("sympy__sympy-20916", "sphinx-doc__sphinx-8595", "scikit-learn__scikit-learn-14141")
EPISODE_TASK = "runner_ray_remote"  # the Ray task nemo-gym 0.7.0 runs each episode in


def test_serve_spreads_episodes_over_a_running_cluster_and_leaves_it_running(
    tmp_path: Path, recording_policy: RecordingPolicy, gym_example_rows: list[dict[str, Any]]
) -> None:
    venv = ensure_gym_venv("local")
    with RayCluster(venv) as cluster:
        cluster.start_head(num_cpus=1)
        cluster.add_node(num_cpus=1, resources={"episode_node": 1})

        port = free_port()
        arguments = ["--sandbox", "local", "--port", str(port), "--concurrency", str(len(INSTANCES))]
        arguments += ["--step-limit", "10", "--step-timeout", "120", "--eval-timeout", "600"]
        arguments += ["--state-dir", str(tmp_path / "serve-state"), "--ray-address", cluster.address]
        with serving(*arguments) as serve:
            printed = " ".join(serve.printed.split())  # rich wraps long lines
            assert f"Episodes run on the Ray cluster at {cluster.address}: 2 nodes, 2 CPUs." in printed, printed

            async def episodes() -> list[tuple[int, dict[str, Any]]]:
                url = f"http://127.0.0.1:{port}"
                return await asyncio.gather(
                    *(
                        post_run(url, run_body(gym_example_rows, iid, recording_policy.session_url(iid)))
                        for iid in INSTANCES
                    )
                )

            for (status, result), instance_id in zip(asyncio.run(episodes()), INSTANCES, strict=True):
                assert status == 200, result
                assert_graded(result, instance_id)
            rest = serve.stop()
        assert serve.process.returncode == 0, rest
        assert "the Ray cluster keeps running" in rest

        # Stopping serve ended its job, not the cluster: its daemons run, both nodes are alive.
        daemons = cluster.daemons()
        assert (daemons.count("gcs_server"), daemons.count("raylet")) == (1, 2), daemons
        state = cluster.state()
        alive = [node for node in state["nodes"] if node["state"] == "ALIVE"]
        assert len(alive) == 2, state["nodes"]
        (second,) = [node["id"] for node in alive if "episode_node" in node["resources"]]
        episode_tasks = [task for task in state["tasks"] if task["name"] == EPISODE_TASK]
        assert [task["state"] for task in episode_tasks] == ["FINISHED"] * len(INSTANCES), episode_tasks
        assert second in {task["node_id"] for task in episode_tasks}, (second, episode_tasks)
