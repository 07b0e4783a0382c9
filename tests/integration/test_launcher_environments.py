"""The launcher's environment preflight against real NeMo-Gym 0.7.0 resources servers.

``workplace_assistant`` takes its tools through a catch-all ``POST /{path}``; ``xlam_fc``
serves none of its rows' tools (its verifier reads the calls). The rows are the servers'
shipped examples as the converter marks them. Only the environment checks are looked at:
the rest of the preflight (GPUs, Miles) is not what this test is about.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.checks import CheckResult
from miles_nemogym.launcher._checks import run_preflight
from miles_nemogym.launcher._config import LauncherConfig
from tests.support.gym_envs import GymEnvironments
from tests.support.prompt_rows import write_jsonl

pytestmark = pytest.mark.integration

ENVS = ["workplace_assistant", "xlam_fc"]


def marked(envs: GymEnvironments, env: str) -> list[dict[str, Any]]:
    """The environment's example rows as Miles prompt rows with the environment marks."""
    return [
        {
            "prompt": row["responses_create_params"]["input"],
            "metadata": {**row, "nemogym_env": env, "nemogym_task_id": f"{env}/{index}"},
        }
        for index, row in enumerate(envs.example_rows(env))
    ]


def environment_checks(tmp_path: Path, envs: GymEnvironments, **fields: Any) -> dict[str, CheckResult]:
    assert set(ENVS) <= set(envs.envs)  # the session's real resources servers, these two among them
    data = write_jsonl(tmp_path / "mixed.jsonl", [row for env in ENVS for row in marked(envs, env)])
    config = LauncherConfig.model_validate({"prompt_data": data, "base_dir": tmp_path, **fields})
    results = run_preflight(config, environ={}, miles_root=None, gpu_counter=lambda environ: (4, "stand-in"))
    return {
        r.name: r for r in results if r.name.startswith("environment") or r.name in ("rows' environments", "settings")
    }


def test_the_preflight_passes_against_real_resources_servers(tmp_path: Path, gym_environments: GymEnvironments) -> None:
    servers = {env: gym_environments.resources_url(env) for env in ENVS}
    results = environment_checks(tmp_path, gym_environments, nemo_gym_envs=servers, tools_not_served=["xlam_fc"])
    assert all(result.ok for result in results.values()), results
    assert results["settings"].detail == "valid; no SWE rows: NEMO_GYM_URL's server is not used"
    wa, xlam = gym_environments.resources_url("workplace_assistant"), gym_environments.resources_url("xlam_fc")
    assert results["environment workplace_assistant"].detail == (
        f"{wa}: POST /seed_session, /verify and every tool (POST /{{path}})"
    )
    assert results["environment xlam_fc"].detail.startswith(f"{xlam}: POST /seed_session, /verify and 0 of the rows'")
    # Without the name, xlam_fc's unserved tools are a failure; its simple_agent is no resources server.
    servers["workplace_assistant"] = gym_environments.agent_url("workplace_assistant")
    results = environment_checks(tmp_path, gym_environments, nemo_gym_envs=servers)
    assert "declares no POST /<tool> for" in results["environment xlam_fc"].detail
    assert results["environment workplace_assistant"].detail == (
        f"{servers['workplace_assistant']} answers but is not a NeMo-Gym resources server "
        "(no POST /seed_session, /verify)"
    )
