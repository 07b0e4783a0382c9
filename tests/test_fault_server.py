"""The ``/run`` stand-in (``tests/support/fault_server.py``) answers as nemo-gym 0.7.0's
``mini_swe_agent_2`` does (``MiniSWEAgent.run``: a ``MiniSWEAgentVerifyResponse``, its
``except`` branch for an episode that raised), so the tests built on it test the real contract."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.support.fault_server import FaultServer

ANSWER_FIELDS = {
    "responses_create_params",
    "response",
    "reward",
    "mask_sample",
    "failure_kind",
    "failure_reason",
    "instance_id",
    "metadata",
}
"""``MiniSWEAgentVerifyResponse``'s fields as FastAPI sends them (``capture_rollout_id`` is excluded)."""


def post_run(server: FaultServer, instance_id: str) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{server.url}/run",
        data=json.dumps({"instance_id": instance_id, "responses_create_params": {"input": []}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_an_instance_is_answered_with_its_own_real_result(
    gym_in_thread: FaultServer, gym_example_rollouts: list[dict[str, Any]]
) -> None:
    row = gym_example_rollouts[0]
    status, answer = post_run(gym_in_thread, row["instance_id"])
    assert status == 200
    assert set(answer) == ANSWER_FIELDS  # no rollout-collector keys (agent_ref, _ng_*)
    assert (answer["mask_sample"], answer["failure_kind"], answer["failure_reason"]) == (False, None, None)
    assert {name: answer[name] for name in ANSWER_FIELDS - {"mask_sample", "failure_kind", "failure_reason"}} == {
        name: row[name] for name in ANSWER_FIELDS - {"mask_sample", "failure_kind", "failure_reason"}
    }
    assert gym_in_thread.received_ids() == [row["instance_id"]]


def test_another_instance_is_graded_for_the_id_it_was_sent(gym_in_thread: FaultServer) -> None:
    status, answer = post_run(gym_in_thread, "Astropy__Astropy-1")
    assert status == 200
    assert answer["instance_id"] == "Astropy__Astropy-1"  # the body's id, as sent
    assert list(answer["metadata"]["eval_report"]) == ["astropy__astropy-1"]  # nemo-gym reports it in lower case
    assert answer["metadata"]["instance_id"] == "astropy__astropy-1"


@pytest.mark.parametrize("mode", ["error_metadata", "echo_key_error"])
def test_a_crashed_episode_is_answered_as_the_servers_except_branch(gym_in_thread: FaultServer, mode: str) -> None:
    sympy = "sympy__sympy-20916"
    gym_in_thread.modes = {sympy: mode}
    status, answer = post_run(gym_in_thread, sympy)
    assert status == 200
    assert set(answer) == ANSWER_FIELDS
    assert answer["reward"] == 0.0 and answer["instance_id"] == sympy
    assert set(answer["metadata"]) == {"error", "traceback"}  # no eval report
    assert answer["response"]["output"] == [] and answer["responses_create_params"]["input"] == []
    assert post_run(gym_in_thread, "django__django-10973")[1]["reward"] == 0.0  # others: their own result
    assert post_run(gym_in_thread, "scikit-learn__scikit-learn-14141")[1]["reward"] == 1.0


def test_an_exception_outside_the_episode_is_a_plain_500(gym_in_thread: FaultServer) -> None:
    gym_in_thread.mode = "500"
    assert post_run(gym_in_thread, "sympy__sympy-20916") == (500, "Internal Server Error")


def test_a_held_run_is_answered_once_released(gym_in_thread: FaultServer) -> None:
    sklearn = "scikit-learn__scikit-learn-14141"
    gym_in_thread.modes = {sklearn: "hold"}
    answered: list[tuple[int, Any]] = []
    client = threading.Thread(target=lambda: answered.append(post_run(gym_in_thread, sklearn)))
    client.start()
    client.join(1.0)
    assert answered == [] and gym_in_thread.held_now() == {sklearn}
    gym_in_thread.release.set()
    client.join(10)
    assert [status for status, _ in answered] == [200] and gym_in_thread.held_now() == set()


def test_it_serves_the_agent_servers_openapi_document(gym_in_thread: FaultServer) -> None:
    with urllib.request.urlopen(f"{gym_in_thread.url}/openapi.json", timeout=10) as response:
        document = json.loads(response.read())
    assert "/run" in document["paths"]
    assert "policy_base_url" in document["components"]["schemas"]["MiniSWEAgentRunRequest"]["properties"]
