"""Raw ``/run`` requests to the real server: a wheel example row pointed at one recording-policy
session with trainer sampling parameters, and the checks on a graded answer."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from miles_nemogym.smoke._policy import SCRIPTED_PATCH

SAMPLING = {"temperature": 0.7, "top_p": 0.9, "max_output_tokens": 512}
EXTRA_BODY = {"top_k": 20, "seed": 7}
API_KEY = "sk-integration-key"


def run_body(rows: list[dict[str, Any]], instance_id: str, session_url: str) -> dict[str, Any]:
    """A real example row, pointed at one recording-policy session, with trainer params."""
    (row,) = [r for r in rows if r["instance_id"] == instance_id]
    body = dict(row)
    body["policy_base_url"] = session_url + "/v1"
    body["policy_api_key"] = API_KEY
    body["responses_create_params"] = {
        "input": [],
        **SAMPLING,
        "metadata": {"extra_body": json.dumps(EXTRA_BODY)},
    }
    return body


async def post_run(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    timeout = aiohttp.ClientTimeout(total=600)
    async with (
        aiohttp.ClientSession(timeout=timeout) as client,
        client.post(f"{url}/run", json=body) as response,
    ):
        return response.status, await response.json()


def assert_graded(result: dict[str, Any], instance_id: str) -> None:
    metadata = result["metadata"]
    assert "error" not in metadata, metadata.get("error")
    report = metadata["eval_report"][instance_id]
    assert set(report["tests_status"]) >= {"FAIL_TO_PASS", "PASS_TO_PASS"}
    # The reward is the grader's verdict, whatever it is on this host.
    assert result["reward"] == (1.0 if report["resolved"] else 0.0)
    # What the scripted policy submitted is what was graded.
    assert metadata["model_patch"] == SCRIPTED_PATCH
