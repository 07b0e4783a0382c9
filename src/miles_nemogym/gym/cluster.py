"""What ``serve --ray-address`` checks of a running Ray cluster before the server starts (docs/scale-out.md)."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_nemogym.gym.venv import GymEnvironmentError, GymVenv, run_in_gym

__all__: list[str] = []

_EPISODE_CPUS = 0.25
"""The CPU each ``mini_swe_agent_2`` episode task asks Ray for (nemo-gym 0.7.0 ``app.py``)."""

_PROBE = r"""
import json, os, sys
payload = json.loads(sys.stdin.read())
out = {"python": "%d.%d.%d" % sys.version_info[:3]}
try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    out["ray"] = ray.__version__
    ray.init(address=payload["address"], logging_level="ERROR", log_to_driver=False)
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    print("\n" + json.dumps(out))
    sys.exit(0)

@ray.remote(num_cpus=0)
def look(python, folder, binaries):
    import os, shutil, sys, ray
    return {
        "missing_binaries": [name for name in binaries if shutil.which(name) is None],
        "python": "%d.%d.%d" % sys.version_info[:3],
        "ray": ray.__version__,
        "gym_python": os.access(python, os.X_OK),
        "state_dir": os.path.isdir(folder),
    }

nodes = [n for n in ray.nodes() if n["Alive"]]
refs = [
    look.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
        sys.executable, payload["state_dir"], payload["binaries"]
    )
    for n in nodes
]
ready, _ = ray.wait(refs, num_returns=len(refs), timeout=payload["timeout"])
out["nodes"] = []
for node, ref in zip(nodes, refs):
    entry = {"id": node["NodeID"], "address": node["NodeManagerAddress"], "cpus": node["Resources"].get("CPU", 0)}
    if ref not in ready:
        entry["error"] = f"the check task did not run within {payload['timeout']} s"
    else:
        try:
            entry.update(ray.get(ref))
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[:1000]
    out["nodes"].append(entry)
ray.shutdown()
print("\n" + json.dumps(out))
"""


@dataclass(frozen=True)
class ClusterNode:
    id: str
    address: str
    cpus: float


def unreachable(address: str, timeout: float = 10.0) -> str | None:
    """``None`` when a TCP connection to ``host:port`` opens, else why not."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


def cluster_problems(report: Mapping[str, Any], venv: GymVenv, state_dir: Path) -> list[str]:
    """What keeps the probed cluster from running this server's episodes, one line each."""
    if "error" in report:
        start = f"{venv.path}/bin/ray start"
        return [
            f"could not join it from the server environment (Python {report.get('python')}, "
            f"Ray {report.get('ray')}): {report['error']}\n"
            f"Every node must run the server environment's Ray: start the head with `{start} --head "
            f"--port PORT` and each other node with `{start} --address HEAD:PORT`."
        ]
    problems = []
    nodes = report.get("nodes") or []
    for node in nodes:
        name = f"node {str(node['id'])[:12]} ({node['address']})"
        if "error" in node:
            problems.append(f"{name}: {node['error']}")
            continue
        for what in ("python", "ray"):
            if node[what] != report[what]:
                problems.append(
                    f"{name} runs {what.capitalize()} {node[what]}, the server environment "
                    f"{report[what]}; start it from {venv.path}/bin/ray"
                )
        if not node["gym_python"]:
            problems.append(
                f"{name} has no {venv.python}: episodes run in the server environment, which must be "
                "at the same path on every node (copy it, or build it there with the same cache folder)"
            )
        for binary in node.get("missing_binaries", []):
            problems.append(f"{name} has no `{binary}` on PATH: the sandbox provider runs it where the episode runs")
        if not node["state_dir"]:
            problems.append(
                f"{name} cannot see {state_dir}: episodes there read the request's config and write "
                "results in it; give --state-dir a folder every node mounts at the same path"
            )
    if not any(float(node.get("cpus", 0)) >= _EPISODE_CPUS for node in nodes):
        problems.append(f"no node has {_EPISODE_CPUS} CPU free for an episode task (`ray start --num-cpus N`)")
    return problems


def check_cluster(
    address: str,
    venv: GymVenv,
    state_dir: Path,
    env: Mapping[str, str],
    *,
    binaries: Sequence[str] = (),
    timeout: float = 120.0,
) -> list[ClusterNode]:
    """The cluster's live nodes once each can run this server's episodes (``binaries`` on its PATH), else an
    error naming each problem and its fix; connects as the server will."""
    refused = unreachable(address)
    if refused:
        raise GymEnvironmentError(
            f"--ray-address {address}: cannot connect ({refused}). Give the address `ray start --head` "
            "printed on the head node, reachable from this machine."
        )
    try:
        payload = {"address": address, "state_dir": str(state_dir), "binaries": list(binaries), "timeout": timeout}
        done = run_in_gym(venv, _PROBE, stdin=json.dumps(payload), cwd=state_dir, env=env, timeout=timeout + 120)
    except (subprocess.TimeoutExpired, OSError) as exc:
        raise GymEnvironmentError(f"--ray-address {address}: the cluster check did not finish: {exc}") from None
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise GymEnvironmentError(
            f"--ray-address {address}: the cluster check failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
        ) from None
    problems = cluster_problems(report, venv, state_dir)
    if problems:
        listed = "\n".join(f"  - {line}" for line in problems)
        raise GymEnvironmentError(f"--ray-address {address}: the cluster cannot run this server's episodes:\n{listed}")
    return [ClusterNode(str(n["id"]), str(n["address"]), float(n["cpus"])) for n in report["nodes"]]
