"""Real NeMo-Gym 0.7.0 resources servers, their ``simple_agent`` and its ``vllm_model``.

The resources servers start as ``miles-nemogym serve --env`` starts them
(``miles_nemogym.gym.environments``: one config composed by nemo-gym's own parser, each
environment's requirements beyond the server venv installed into an overlay venv cached by
that set). Here the same config's ``simple_agent`` of each environment and the
``vllm_model`` it calls (pointed at a scripted chat policy) start next to them, for the
parity tests.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.gym.composition import Judge
from miles_nemogym.gym.config import parse_configs
from miles_nemogym.gym.environments import EnvironmentPlan, EnvironmentServers, _payload, plan
from miles_nemogym.gym.venv import BuildLines, GymEnvironmentError, GymPythonNotFoundError, GymVenv, ensure_gym_venv

MODEL = "policy_model"
# What ray.init raises when the node it started did not register in time (code_gen's private Ray).
_RAY_NODE_TIMEOUT = "The current node timed out during startup"


class GymEnvironments:
    """``resources_url(env)`` and ``agent_url(env)`` of each started environment."""

    def __init__(
        self,
        venv: GymVenv,
        envs: list[str],
        policy_v1_url: str,
        state_dir: Path,
        stand_ins: Mapping[str, tuple[Path, Path]] | None = None,
    ) -> None:
        """``stand_ins``: resources servers not in the wheel, instance name -> (its config file,
        the folder of its ``app.py``); started with their ``simple_agent`` like the others."""
        self.venv = venv
        self.stand_ins = dict(stand_ins or {})
        self.envs = envs
        self.policy_v1_url = policy_v1_url
        self.state_dir = state_dir
        self._servers: EnvironmentServers | None = None
        self._agents: dict[str, str] = {}

    @property
    def servers(self) -> EnvironmentServers:
        if self._servers is None:
            raise RuntimeError("GymEnvironments is not started")
        return self._servers

    def resources_url(self, env: str) -> str:
        if env in self.stand_ins:
            return f"http://127.0.0.1:{self.servers.ports[env]}"
        return self.servers.urls()[env]

    def agent_url(self, env: str) -> str:
        return f"http://127.0.0.1:{self.servers.ports[self._agents[env]]}"

    def example_rows(self, env: str) -> list[dict[str, Any]]:
        path = self.venv.site_packages / "resources_servers" / env / "data" / "example.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def start(self, attempts: int = 2) -> GymEnvironments:
        """Start every server; again (all of them) if a Ray the start-up began missed its
        fixed 30 s to register its node, which a loaded 2-core machine can make it miss."""
        attempt = 1
        try:
            while True:
                try:
                    return self._start()
                except GymEnvironmentError as error:
                    if attempt >= attempts or _RAY_NODE_TIMEOUT not in str(error):
                        raise
                    print(f"[gym-envs] starting again: {str(error).splitlines()[0]}", file=sys.__stderr__, flush=True)
                    attempt += 1
        except BaseException:
            self.stop()  # the caller gets no object to stop: nothing may be left behind
            raise

    def _start(self) -> GymEnvironments:
        plans = plan(self.envs)
        self._agents = {}
        self._servers = EnvironmentServers(
            self.venv,
            plans,
            state_dir=self.state_dir,
            policy_base_url=self.policy_v1_url,
            progress=BuildLines("gym-envs"),
            extra_env={"HF_HUB_OFFLINE": "1"},
            extra_configs=[config for config, _ in self.stand_ins.values()],
            app_folders={name: folder for name, (_, folder) in self.stand_ins.items()},
        )
        # Each environment's simple_agent: the composed config's agent naming its resources server.
        # The config is only known once composed, so the agents are found through a first compose.
        config = self._servers.compose()
        instances = {p.instance: p.name for p in plans} | {name: name for name in self.stand_ins}
        for name, entry in config.items():
            agent = (entry.get("responses_api_agents") or {}).get("simple_agent") if isinstance(entry, dict) else None
            env = instances.get((agent or {}).get("resources_server", {}).get("name")) if agent else None
            if env is not None:
                self._agents.setdefault(env, name)
        self._servers.start(also=[*self.stand_ins, *self._agents.values(), MODEL])
        return self

    def log_tail(self, name: str) -> str:
        return self.servers.log_tail(name)

    def stop(self) -> None:
        if self._servers is not None:
            # code_gen takes ~14 s to shut its Ray down; its process group and marked processes are
            # killed after a short grace instead (the other servers exit within a second).
            self._servers.stop(timeout=3.0)


@contextlib.contextmanager
def running_environments(envs: list[str], policy_v1_url: str, state_dir: Path) -> Iterator[GymEnvironments]:
    """``envs`` started from the cached server venv (built first if needed), stopped after."""
    try:
        venv = ensure_gym_venv(progress=lambda line: print(f"[gym-venv] {line}", file=sys.__stderr__, flush=True))
    except GymPythonNotFoundError as error:
        pytest.fail(str(error), pytrace=False)
    servers = GymEnvironments(venv, envs, policy_v1_url, state_dir)
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()


def compose_each(gym: GymVenv, plans: Sequence[EnvironmentPlan], judge: Judge | None, cwd: Path) -> dict[str, str]:
    """Each plan's config composed on its own, in one parser process: name -> YAML or a ``ConfigRefusal``."""
    answers = parse_configs(gym, [_payload(gym.site_packages, [p], judge) for p in plans], cwd, "environments' configs")
    return {p.name: answer for p, answer in zip(plans, answers, strict=True)}
