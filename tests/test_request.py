"""Rules of the /run request builder (episode/run.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from miles_nemogym.episode.run import RequestError, build_run_body, responses_create_params

POLICY = "http://10.0.0.5:30010/sessions/s1/v1"
ALL_MILES_KEYS = {
    "temperature": 0.8, "top_p": 0.95, "top_k": 40, "max_tokens": 4096, "min_p": 0.05,
    "min_tokens": 2, "stop": ["</s>"], "stop_token_ids": [2], "skip_special_tokens": False,
    "no_stop_trim": True, "spaces_between_special_tokens": False, "repetition_penalty": 1.1,
    "presence_penalty": 0.1, "frequency_penalty": 0.2, "seed": 11,
}  # fmt: skip


def test_instance_fields_go_to_the_top_level(first_row: dict[str, Any]) -> None:
    body = build_run_body(first_row, {"temperature": 1.0}, policy_base_url=POLICY)
    for key in (
        "instance_id",
        "repo",
        "base_commit",
        "problem_statement",
        "patch",
        "test_patch",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "version",
        "environment_setup_commit",
        "subset",
        "split",
    ):
        assert body[key] == first_row[key]  # fmt: skip
    assert body["policy_base_url"] == POLICY


def test_every_miles_sampling_key_reaches_the_server(first_row: dict[str, Any]) -> None:
    rcp = build_run_body(first_row, ALL_MILES_KEYS, policy_base_url=POLICY)["responses_create_params"]
    assert rcp["temperature"] == 0.8 and rcp["top_p"] == 0.95 and rcp["max_output_tokens"] == 4096
    extra = json.loads(rcp["metadata"]["extra_body"])
    typed = {"temperature", "top_p", "max_tokens"}
    assert extra == {k: v for k, v in ALL_MILES_KEYS.items() if k not in typed}
    assert rcp["input"] == []


def test_none_means_unset(first_row: dict[str, Any]) -> None:
    rcp = build_run_body(first_row, {"temperature": None, "top_k": None}, policy_base_url=POLICY)[
        "responses_create_params"
    ]
    assert "temperature" not in rcp and "metadata" not in rcp


def test_metadata_is_never_mutated(first_row: dict[str, Any]) -> None:
    frozen = copy.deepcopy(first_row)
    build_run_body(first_row, ALL_MILES_KEYS, policy_base_url=POLICY, policy_api_key="k")
    assert first_row == frozen


def test_bookkeeping_results_and_routing_keys_are_not_sent(first_row: dict[str, Any]) -> None:
    noisy = {**first_row, "max_seq_len": 1, "session_server_id": "a:1", "session_server_instance_id": 0,
             "reward": 1.0, "eval_report": {}, "nemogym": {}, "agent_metrics": {},
             "policy_base_url": "http://evil/v1", "policy_api_key": "from-data"}  # fmt: skip
    body = build_run_body(noisy, {}, policy_base_url=POLICY)
    assert body["policy_base_url"] == POLICY
    assert "policy_api_key" not in body
    for key in (
        "max_seq_len",
        "session_server_id",
        "session_server_instance_id",
        "reward",
        "eval_report",
        "nemogym",
        "agent_metrics",
    ):
        assert key not in body  # fmt: skip


def test_row_params_are_merged_and_the_trainer_wins() -> None:
    row_params = {
        "input": [],
        "temperature": 0.1,
        "tool_choice": "required",
        "metadata": {"extra_body": '{"top_k": 5, "min_p": 0.3}', "chat_template_kwargs": '{"enable_thinking": false}'},
    }
    rcp = responses_create_params(row_params, {"temperature": 0.9, "top_k": 50})
    assert rcp["temperature"] == 0.9 and rcp["tool_choice"] == "required"
    assert json.loads(rcp["metadata"]["extra_body"]) == {"top_k": 50, "min_p": 0.3}
    assert rcp["metadata"]["chat_template_kwargs"] == '{"enable_thinking": false}'


def test_row_extra_body_given_as_object_is_encoded() -> None:
    rcp = responses_create_params({"metadata": {"extra_body": {"top_k": 5}}}, {})
    assert json.loads(rcp["metadata"]["extra_body"]) == {"top_k": 5}


@pytest.mark.parametrize(
    ("row_params", "kwargs", "needle"),
    [
        ({"top_k": 3}, {}, "responses_create_params.top_k: the NeMo-Gym server rejects this key"),
        ({"metadata": {"extra_body": "not json"}}, {"top_k": 1}, "['extra_body'] must be a JSON object encoded"),
        ({"metadata": {"extra_body": "[1]"}}, {"seed": 1}, "must be a JSON object, got list"),
        ({}, {"max_tokens": 0}, "max_output_tokens"),
        ({}, {"temperature": float("nan")}, "must be finite"),
        ({}, {"stop": {1, 2}}, "cannot be sent as JSON"),
        ("text", {}, "must be an object"),
    ],
)
def test_invalid_params_fail_with_the_field_named(row_params: Any, kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(RequestError) as info:
        responses_create_params(row_params, kwargs)
    assert needle in str(info.value)


def test_empty_metadata_explains_the_fix() -> None:
    with pytest.raises(RequestError, match="miles-nemogym convert"):
        build_run_body({}, {}, policy_base_url=POLICY)


def test_missing_instance_id_is_named(first_row: dict[str, Any]) -> None:
    del first_row["instance_id"]
    with pytest.raises(RequestError, match=r"metadata\.instance_id"):
        build_run_body(first_row, {}, policy_base_url=POLICY)


def test_scan_mode_leaves_routing_to_the_server(first_row: dict[str, Any]) -> None:
    body = build_run_body(first_row, {}, policy_base_url=None)
    assert "policy_base_url" not in body and "policy_api_key" not in body


def test_the_json_check_accepts_exactly_what_json_dumps_accepts(first_row: dict[str, Any]) -> None:
    """build_run_body checks sendability without serializing; it must agree with json.dumps."""
    import enum
    import json as std_json

    class Str(str):
        pass

    class Color(enum.IntEnum):
        RED = 1

    circular: list[Any] = []
    circular.append(circular)
    values: list[Any] = [
        1, 1.5, "s", None, True, float("nan"), float("inf"), -float("inf"), [1, [2, {"a": float("nan")}]],
        (1, 2), {1, 2}, b"x", {1.5: "k"}, {float("nan"): 1}, {True: 1}, {None: 1}, {(1, 2): 1},
        Str("sub"), Color.RED, {"a": {"b": [object()]}}, circular, {"k": Str("v")}, [], {},
    ]  # fmt: skip
    for value in values:
        try:
            std_json.dumps(value, allow_nan=False)
            accepted = True
        except (TypeError, ValueError, RecursionError):
            accepted = False
        try:
            build_run_body({**first_row, "task_field": value}, {}, policy_base_url=POLICY)
            sent = True
        except RequestError as error:
            assert "metadata['task_field']" in str(error)
            sent = False
        assert sent == accepted, value
