"""NeMo-Gym environments played by their own agent server's ``/run`` (``gymnasium_agent``,
``tool_simulation_agent``, a routed ``simple_agent``), started as ``miles-nemogym serve --env NAME
--routed`` starts them: the resources servers, each environment's agent, and this package's
routing model as their ``policy_model`` (``miles_nemogym.gym.environments``):
``running_routed_agents``. ``tests/integration/test_miles_routed_agents.py`` starts every environment
here (~75 s on 2 cores); the ``routed_blackjack`` fixture (import it by name) starts blackjack's alone
(~8 s), for a test that needs one routed agent. ``gymnasium_scripts``: the ``gymnasium_agent``
environments' scripted policies."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.gym.environments import EnvironmentServers, plan
from miles_nemogym.gym.venv import BuildLines, GymPythonNotFoundError, ensure_gym_venv
from tests.support.env_scripts import ENVIRONMENTS
from tests.support.hostile_session import SESSION_SERVERS
from tests.support.scripted_chat import Turn, tool

GYMNASIUM = ("blackjack", "example_multi_turn_gymnasium", "openair_congestion")
"""Environments whose config gives them ``gymnasium_agent``."""
TOOL_SIMULATION = ("swe_pivot",)
"""Environments whose config gives them ``tool_simulation_agent`` (one policy call, then ``/verify``)."""
HARNESS = ("opencode_math",)
"""Environments of ``environments/`` played by a harness agent running its CLI (``opencode_agent``:
the ``opencode`` CLI, installed from npm by ``serve``)."""
HARNESS_RUN = ("kilocode_math", "cline_math")
"""Harness environments played through their agent's own ``/run`` against a scripted session
(``kilocode_agent``: the ``kilo`` CLI, ``cline_agent``: the ``cline`` CLI, installed from npm by
``serve``)."""
AGENTS = GYMNASIUM + TOOL_SIMULATION + HARNESS + HARNESS_RUN
"""Every environment played by an agent other than ``simple_agent`` that the integration tests drive."""
ROUTED_BENCHMARKS = ("gdp_pdf",)
"""Benchmarks played by their own agent (not ``simple_agent``) the integration tests drive by name
(``tests/integration/test_agent_benchmarks.py``): converted, routed to the agent's ``/run``, graded."""
ROUTED_SIMPLE = ENVIRONMENTS
"""The ``simple_agent`` environments of the in-process tests, all of them, here played through
``simple_agent``'s own ``/run``."""


BLACKJACK_REWARD = {"win": 1.0, "draw": 0.0, "loss": -1.0, "bust": -1.0}
"""blackjack's reward for each result its last step reports (``info["result"]``)."""


def gymnasium_scripts(env: str) -> dict[str, list[Turn]]:
    """The scripted policies of a ``GYMNASIUM`` environment's first example row, by outcome."""
    if env == "example_multi_turn_gymnasium":  # its first row: France; two follow-ups; "Eiffel" in the last answer
        return {
            "gold": [Turn(content="Paris."), Turn(content="About two million."), Turn(content="The Eiffel Tower.")],
            "wrong": [Turn(content="Paris."), Turn(content="About two million."), Turn(content="The Louvre.")],
        }
    if env == "openair_congestion":  # 16 steps of one action: noop, or one the guardrail rejects (penalized)
        rejected = tool("set_prb_cap", cell_id=0, target="ue", target_id=0, max_prb=999)  # maximum 273
        return {"noop": [Turn(tool_calls=(tool("noop"),))], "rejected": [Turn(tool_calls=(rejected,))]}
    # blackjack deals at random: stand at once (one turn), or hit until the hand ends (bust, or 5 turns).
    return {"stand": [Turn(content="<action>stand</action>")], "hit": [Turn(content="<action>hit</action>")]}


class RoutedAgents:
    """The started servers; ``setting`` is the ``NEMO_GYM_ENVS`` value ``serve`` prints."""

    def __init__(self, servers: EnvironmentServers) -> None:
        self.servers = servers
        self.setting: dict[str, Any] = json.loads(servers.setting())

    def example_rows(self, env: str) -> list[dict[str, Any]]:
        [plan] = [p for p in self.servers.plans if p.name == env]
        path = self.servers.gym.site_packages / plan.rows
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def agent_url(self, env: str) -> str:
        return str(self.setting[env]["agent"])


@contextlib.contextmanager
def running_routed_agents(
    envs: Sequence[str], state_dir: Path, session_servers: Sequence[str] = SESSION_SERVERS
) -> Iterator[RoutedAgents]:
    """``envs`` with their agents and the routing model (allowing ``session_servers``), stopped after."""
    try:
        venv = ensure_gym_venv(progress=lambda line: print(f"[gym-venv] {line}", file=sys.__stderr__, flush=True))
    except GymPythonNotFoundError as error:
        pytest.fail(str(error), pytrace=False)
    servers = EnvironmentServers(
        venv,
        plan(list(envs), routed=True),
        state_dir=state_dir,
        progress=BuildLines("routed-agents"),
        extra_env={"HF_HUB_OFFLINE": "1"},
        session_servers=session_servers,
    )
    try:
        servers.start()
        yield RoutedAgents(servers)
    finally:
        servers.stop(timeout=3.0)


@pytest.fixture(scope="module")
def routed_blackjack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoutedAgents]:
    """blackjack's resources server, its ``gymnasium_agent`` and the routing model, for one module."""
    with running_routed_agents(["blackjack"], tmp_path_factory.mktemp("routed-blackjack")) as agents:
        yield agents


_MODEL_URLS = """
import sys
from nemo_gym.server_utils import apply_rollout_prefix
for rollout in sys.argv[2:]:
    print(apply_rollout_prefix(sys.argv[1], rollout, token_capture=True) + "/v1")
"""


def model_base_urls(agents: RoutedAgents, *rollouts: str) -> list[str]:
    """The routing model's base URL an agent (or a sandboxed harness) calls for each rollout id
    (nemo-gym's own ``apply_rollout_prefix``, as ``resolve_model_base_url``/``base_url_for_run`` build it)."""
    model = f"http://127.0.0.1:{agents.servers.ports['policy_model']}"
    return model_base_urls_at(agents.servers.gym.python, model, *rollouts)


def model_base_urls_at(python: Path, model: str, *rollouts: str) -> list[str]:
    """``model_base_urls`` of the routing model at ``model``, built by the server venv's ``python``."""
    import subprocess

    done = subprocess.run(
        [str(python), "-c", _MODEL_URLS, model, *rollouts], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout.strip().splitlines()[-len(rollouts) :]
