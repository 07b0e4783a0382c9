"""The checks ``serve --ray-address`` runs on a cluster before starting the server.

The probe itself (joining a real cluster, one check task per node) runs in
tests/integration/test_ray_cluster.py; here, what each probe answer means.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.gym._providers import node_binaries
from miles_nemogym.gym.cluster import ClusterNode, check_cluster, cluster_problems
from miles_nemogym.gym.venv import GymEnvironmentError, GymVenv
from tests.support.ports import free_port
from tests.support.scripts import shell_script

VENV = GymVenv(path=Path("/opt/gym"), python=Path("/opt/gym/bin/python"), site_packages=Path("/opt/gym/lib"))
STATE = Path("/shared/state")


def _node(**changes: Any) -> dict[str, Any]:
    node = {"id": "a1b2c3d4e5f6a7b8", "address": "10.0.0.2", "cpus": 8.0, "python": "3.13.0", "ray": "2.60.0"}
    return {**node, "gym_python": True, "state_dir": True, **changes}


def _report(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"python": "3.13.0", "ray": "2.60.0", "nodes": list(nodes)}


def test_a_cluster_of_matching_nodes_passes() -> None:
    assert cluster_problems(_report(_node(), _node(id="ffff", cpus=0.0)), VENV, STATE) == []


def test_a_cluster_that_refuses_the_server_says_how_to_start_one_it_accepts() -> None:
    report = {"python": "3.13.0", "ray": "2.60.0", "error": "RuntimeError: Version mismatch: ... Ray: 2.49.0"}
    (problem,) = cluster_problems(report, VENV, STATE)
    assert "Version mismatch" in problem
    assert "/opt/gym/bin/ray start --head --port PORT" in problem
    assert "/opt/gym/bin/ray start --address HEAD:PORT" in problem


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"ray": "2.49.0"}, "runs Ray 2.49.0, the server environment 2.60.0; start it from /opt/gym/bin/ray"),
        ({"python": "3.12.4"}, "runs Python 3.12.4, the server environment 3.13.0"),
        ({"gym_python": False}, "has no /opt/gym/bin/python: episodes run in the server environment"),
        ({"state_dir": False}, "cannot see /shared/state"),
        ({"error": "the check task did not run within 120 s"}, "the check task did not run within 120 s"),
    ],
)
def test_each_node_problem_is_named_with_its_node(change: dict[str, Any], says: str) -> None:
    problems = cluster_problems(_report(_node(), _node(id="0123456789abcdef00", **change)), VENV, STATE)
    assert len(problems) == 1
    assert problems[0].startswith("node 0123456789ab (10.0.0.2)")
    assert says in problems[0]


def test_a_cluster_without_cpu_for_an_episode_is_refused() -> None:
    (problem,) = cluster_problems(_report(_node(cpus=0.0)), VENV, STATE)
    assert "no node has 0.25 CPU" in problem


def test_an_address_where_nothing_listens_is_refused_before_any_probe(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    # The venv does not exist: the check must fail on the address, not on running the probe.
    with pytest.raises(GymEnvironmentError, match=rf"--ray-address {address}: cannot connect"):
        check_cluster(address, VENV, tmp_path, env={})


@pytest.fixture
def head_address() -> Iterator[str]:
    """A listening loopback port, standing in for a head's GCS port (the probe is faked)."""
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        yield f"127.0.0.1:{head.getsockname()[1]}"


def _venv_answering(tmp_path: Path, script: str) -> GymVenv:
    python = shell_script(tmp_path / "venv" / "bin" / "python", script)
    return GymVenv(path=tmp_path / "venv", python=python, site_packages=tmp_path / "venv" / "lib")


def test_the_probes_answer_decides(tmp_path: Path, head_address: str) -> None:
    nodes = [_node(), _node(id="0123456789abcdef00", ray="2.49.0")]
    answer = json.dumps({"python": "3.13.0", "ray": "2.60.0", "nodes": nodes})
    venv = _venv_answering(tmp_path, f"cat > /dev/null; echo 'ray noise'; echo '{answer}'")
    with pytest.raises(GymEnvironmentError) as caught:
        check_cluster(head_address, venv, tmp_path, env={})
    assert str(caught.value).splitlines() == [
        f"--ray-address {head_address}: the cluster cannot run this server's episodes:",
        f"  - node 0123456789ab (10.0.0.2) runs Ray 2.49.0, the server environment 2.60.0; "
        f"start it from {tmp_path / 'venv'}/bin/ray",
    ]
    good = json.dumps({"python": "3.13.0", "ray": "2.60.0", "nodes": [_node()]})
    venv = _venv_answering(tmp_path, f"cat > /dev/null; echo '{good}'")
    assert check_cluster(head_address, venv, tmp_path, env={}) == [ClusterNode("a1b2c3d4e5f6a7b8", "10.0.0.2", 8.0)]


def test_a_probe_that_crashes_is_reported_with_its_stderr(tmp_path: Path, head_address: str) -> None:
    venv = _venv_answering(tmp_path, "echo 'ModuleNotFoundError: No module named ray' >&2; exit 1")
    with pytest.raises(GymEnvironmentError, match=r"the cluster check failed \(exit 1\):\nModuleNotFoundError"):
        check_cluster(head_address, venv, tmp_path, env={})


def test_a_node_without_the_sandbox_cli_is_named() -> None:
    (problem,) = cluster_problems(
        _report(_node(), _node(id="0123456789abcdef00", missing_binaries=["docker"])), VENV, STATE
    )
    assert problem == (
        "node 0123456789ab (10.0.0.2) has no `docker` on PATH: the sandbox provider runs it where the episode runs"
    )


@pytest.mark.parametrize(
    ("sandbox", "block", "binaries"),
    [
        ("docker", {}, ["docker"]),
        ("enroot", {}, ["enroot"]),
        ("apptainer", {}, ["apptainer"]),
        ("apptainer", {"bin_path": "/opt/apptainer/bin"}, []),
        ("daytona", {}, []),
        ("local", {}, []),
    ],
)
def test_which_cli_every_node_needs(sandbox: str, block: dict[str, Any], binaries: list[str]) -> None:
    assert node_binaries(sandbox, {"sandbox": {sandbox: block}}) == binaries
