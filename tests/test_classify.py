"""Classification of /run answers (episode/run.py), on the real results nemo-gym ships."""

from __future__ import annotations

import json
from typing import Any

import pytest

from miles_nemogym.episode.run import classify_http


def encode(value: Any) -> bytes:
    return json.dumps(value).encode()


def test_the_five_real_results_are_valid_measurements(gym_example_rollouts: list[dict[str, Any]]) -> None:
    assert len(gym_example_rollouts) == 5
    turns: dict[str, int | None] = {}
    for result in gym_example_rollouts:
        outcome = classify_http(200, encode(result))
        record = outcome.record
        report = result["metadata"]["eval_report"][result["instance_id"]]
        tests = report["tests_status"]
        assert record.status == "ok" and not record.mask_sample
        assert outcome.reward == result["reward"]
        assert record.resolved == report["resolved"]
        assert record.patch_applied == report["patch_successfully_applied"]
        assert record.fail_to_pass is not None and record.pass_to_pass is not None
        assert record.fail_to_pass.passed == len(tests["FAIL_TO_PASS"]["success"])
        assert record.fail_to_pass.failed == len(tests["FAIL_TO_PASS"]["failure"])
        assert record.pass_to_pass.passed == len(tests["PASS_TO_PASS"]["success"])
        calls = sum(1 for item in result["response"]["output"] if item["type"] == "function_call")
        assert record.tool_calls == calls
        turns[result["instance_id"]] = record.turns
        assert outcome.eval_report == result["metadata"]
    assert turns == {  # runs of model items in each real episode's output
        "scikit-learn__scikit-learn-14141": 5, "pylint-dev__pylint-4551": 5, "django__django-10973": 10,
        "sphinx-doc__sphinx-8595": 20, "sympy__sympy-20916": 22,
    }  # fmt: skip
    resolved = [r for r in gym_example_rollouts if r["reward"] == 1.0]
    assert [r["instance_id"] for r in resolved] == ["scikit-learn__scikit-learn-14141"]


def test_turns_are_runs_of_model_items(gym_example_rollouts: list[dict[str, Any]]) -> None:
    output = [
        {"type": "message"}, {"type": "function_call"}, {"type": "function_call"},
        {"type": "function_call_output"}, {"type": "function_call_output"},
        {"type": "function_call"}, {"type": "function_call_output"},
        {"type": "message"},
    ]  # fmt: skip
    result = gym_example_rollouts[0]
    record = classify_http(200, encode({**result, "response": {**result["response"], "output": output}})).record
    assert (record.turns, record.tool_calls) == (3, 3)


def test_server_error_metadata_is_a_masked_failure(gym_example_rollouts: list[dict[str, Any]]) -> None:
    crashed = {**gym_example_rollouts[0], "reward": 0.0, "metadata": {"error": "boom\nline2", "traceback": "T"}}
    outcome = classify_http(200, encode(crashed))
    assert outcome.record.mask_sample and outcome.record.status == "failed"
    assert outcome.record.failure_kind == "agent_run_error"
    assert outcome.record.failure_reason == "server error: line2"  # the exception line
    assert outcome.eval_report == crashed["metadata"]


def test_server_failure_kind_and_mask_are_kept(gym_example_rollouts: list[dict[str, Any]]) -> None:
    masked = {**gym_example_rollouts[0], "mask_sample": True, "failure_kind": "provider_oom_killed",
              "failure_reason": "container OOM"}  # fmt: skip
    outcome = classify_http(200, encode(masked))
    assert outcome.reward == 0.0 and outcome.record.server_reward == masked["reward"]
    assert (outcome.record.failure_kind, outcome.record.failure_reason) == ("provider_oom_killed", "container OOM")


def test_degraded_but_valid_keeps_its_reward(gym_example_rollouts: list[dict[str, Any]]) -> None:
    result = next(r for r in gym_example_rollouts if r["reward"] == 1.0)
    outcome = classify_http(200, encode({**result, "failure_kind": "verifier_error", "mask_sample": False}))
    assert outcome.reward == 1.0 and outcome.record.status == "ok"
    assert outcome.record.failure_kind == "verifier_error"


def test_a_zero_without_an_eval_report_is_not_trusted(gym_example_rollouts: list[dict[str, Any]]) -> None:
    outcome = classify_http(200, encode({**gym_example_rollouts[1], "metadata": {}}))
    assert outcome.record.mask_sample and "no SWE-bench eval report" in (outcome.record.failure_reason or "")


@pytest.mark.parametrize(
    ("status", "body", "kind", "needle"),
    [
        (500, b"Internal Server Error", "agent_run_error", "HTTP 500"),
        (502, b"<html>bad gateway</html>", "agent_run_error", "bad gateway"),
        (422, b'{"detail": [{"loc": ["body", "x"], "msg": "bad"}]}', "agent_request_failed", '"msg": "bad"'),
        (404, b'{"detail": "Not Found"}', "agent_request_failed", "Not Found"),
        (200, b"<html>", "agent_run_error", "undecodable"),
        (200, b'{"no_reward": 1}', "verifier_error", "reward"),  # the one judge's step 2, as from /verify
        (204, b"", "agent_run_error", "unexpected HTTP 204"),
    ],
)
def test_http_failures(status: int, body: bytes, kind: str, needle: str) -> None:
    outcome = classify_http(status, body)
    assert outcome.reward == 0.0 and outcome.record.mask_sample
    assert outcome.record.failure_kind == kind and outcome.record.http_status == status
    assert needle in (outcome.record.failure_reason or "")


def test_reasons_are_bounded() -> None:
    outcome = classify_http(500, b"x" * 10_000)
    assert len(outcome.record.failure_reason or "") <= 300


def test_a_ray_wrapped_server_error_is_reduced_to_its_exception_line(
    gym_example_rollouts: list[dict[str, Any]],
) -> None:
    error = (
        "\x1b[36mray::runner_ray_remote()\x1b[39m (pid=1, ip=127.0.0.1)\n"
        + '  File "x.py", line 1, in f\n' * 40
        + "requests.exceptions.ConnectionError: Failed to resolve 'raw.githubusercontent.com'\n"
    )
    crashed = {**gym_example_rollouts[0], "reward": 0.0, "metadata": {"error": error, "traceback": "T"}}
    reason = classify_http(200, encode(crashed)).record.failure_reason
    assert reason == (
        "server error: requests.exceptions.ConnectionError: Failed to resolve 'raw.githubusercontent.com'"
    )
