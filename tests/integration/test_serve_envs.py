"""``miles-nemogym serve --env`` as a real process: the SWE server and real NeMo-Gym 0.7.0
resources servers side by side, the settings a trainer exports, and nothing left after SIGTERM;
and the plan a dry run shows (from the wheel) against what nemo-gym's parser composes."""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_nemogym.checks._server_probe import identify
from miles_nemogym.cli.main import app
from miles_nemogym.gym.config import PLACEHOLDER_POLICY_URL
from miles_nemogym.gym.environments import EnvironmentServers, plan
from miles_nemogym.gym.venv import ensure_gym_venv
from miles_nemogym.gym.wheel import read_member
from miles_nemogym.settings import Settings
from tests.support.ray_cluster import pids_with_environment
from tests.support.serve_process import exported, serving

pytestmark = pytest.mark.integration

ENVS = ("mcqa", "xlam_fc")


def _seed(url: str, env: str) -> int:
    row = json.loads(read_member(f"resources_servers/{env}/data/example.jsonl").decode().splitlines()[0])
    request = urllib.request.Request(
        f"{url}/seed_session", data=json.dumps(row).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        status: int = answer.status
        return status


def test_serve_env_starts_resources_servers_next_to_swe_and_stops_them_all(tmp_path: Path) -> None:
    state = tmp_path / "serve-state"
    arguments = ["--sandbox", "local", "--port", "0", "--concurrency", "1", "--state-dir", str(state)]
    key = f"sk-policy-{uuid.uuid4().hex}"
    environment = {**os.environ, "NEMO_GYM_POLICY_API_KEY": key}
    with serving(*arguments, *(f"--env={env}" for env in ENVS), env=environment) as serve:
        printed = exported(serve.printed)
        assert set(printed) == {"NEMO_GYM_URL", "NEMO_GYM_ENVS"}, serve.printed
        settings = Settings.from_env(printed)
        assert sorted(settings.environments) == sorted(ENVS)
        for env, server in settings.environments.items():
            assert _seed(server.url, env) == 200
            # Each real server names the instance nemo-gym's config gives the environment, which doctor
            # compares: the two URLs swapped fail, each naming what answered.
            identity = identify(f"{server.url}/openapi.json", 30)
            assert identity is not None and identity.instance == plan([env])[0].instance, identity
        swapped = json.dumps(dict(zip(ENVS, [settings.environments[e].url for e in reversed(ENVS)], strict=True)))
        doctor = CliRunner().invoke(app, ["doctor"], env={**printed, "NEMO_GYM_ENVS": swapped})
        assert doctor.exit_code == 1, doctor.output
        assert "is not mcqa's resources server: it answers as xlam_fc" in " ".join(doctor.output.split())
        with urllib.request.urlopen(f"{settings.gym_url}/openapi.json", timeout=30) as answer:
            assert "/run" in json.load(answer)["paths"]
        running = pids_with_environment(str((state / "environments").resolve()))
        assert len(running) >= len(ENVS), running
        # Only serve itself holds the policy API key: no server it started (SWE, mcqa, xlam_fc, their Ray).
        assert len(pids_with_environment(str(state.resolve()))) > len(running)  # the SWE server's too
        assert pids_with_environment(key) == [serve.process.pid]
        rest = serve.stop()
    assert serve.process.returncode == 0, rest
    assert "stopped." in rest
    assert pids_with_environment(str(state.resolve())) == []
    for env in ENVS:
        assert (state / "environments" / f"{env}.log").is_file()


def test_the_plan_a_dry_run_shows_is_what_nemo_gyms_parser_composes(tmp_path: Path) -> None:
    plans = plan(["workplace_assistant", "equivalence_rule", "math_with_judge", "code_gen"])
    config = EnvironmentServers(ensure_gym_venv(), plans, state_dir=tmp_path).compose()
    for p in plans:
        assert p.name in config[p.instance]["resources_servers"], p
        agents = [
            entry["responses_api_agents"]["simple_agent"]
            for entry in config.values()
            if isinstance(entry, dict)
            and entry.get("responses_api_agents", {}).get("simple_agent", {}).get("resources_server", {}).get("name")
            == p.instance
        ]
        assert [agent.get("max_steps") for agent in agents] == [p.max_steps], p
    # The model server the configs refer to is there (never started), pointed at a URL nothing answers.
    assert config["policy_model"]["responses_api_models"]["vllm_model"]["base_url"] == "${policy_base_url}"
    assert config["policy_base_url"] == PLACEHOLDER_POLICY_URL
