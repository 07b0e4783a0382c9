"""The pure half of the converter: row validation, subset/split rules, the row mapping."""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

import pytest

from miles_nemogym.data import convert_row
from miles_nemogym.data._convert import RowInvalidError, encode_row
from miles_nemogym.data._rows import DatasetKind, Routing, infer_kind, resolve_routing, to_prompt_row
from miles_nemogym.data._schema import REQUIRED_FIELDS, FieldProblem, SweBenchInstance, validate_instance
from miles_nemogym.episode.run import build_run_body


def problems_of(row: dict[str, Any]) -> list[FieldProblem]:
    result = validate_instance(row)
    assert isinstance(result, list), "the row was expected to be refused"
    return result


def test_every_real_row_validates(gym_example_rows: list[dict[str, Any]]) -> None:
    for example in gym_example_rows:
        instance = validate_instance(example)
        assert isinstance(instance, SweBenchInstance), instance
        assert example["FAIL_TO_PASS"] == instance.FAIL_TO_PASS
        assert example["PASS_TO_PASS"] == instance.PASS_TO_PASS


@pytest.mark.parametrize("field", REQUIRED_FIELDS)
def test_each_required_field_missing_is_named(sympy_copy: dict[str, Any], field: str) -> None:
    del sympy_copy[field]
    problems = problems_of(sympy_copy)
    assert [(p.field, p.rule) for p in problems] == [(field, "missing")]
    assert field in str(problems[0])


@pytest.mark.parametrize(
    ("field", "value", "rule", "words"),
    [
        ("instance_id", 17, "wrong_type", "string"),
        ("instance_id", "", "bad_value", "at least 1"),
        ("repo", "django", "bad_value", "owner/name"),
        ("repo", ["django/django"], "wrong_type", "string"),
        ("base_commit", None, "wrong_type", "string"),
        ("problem_statement", "", "bad_value", "at least 1"),
        ("version", 0.2, "wrong_type", "'0.20' is not 0.2"),
        ("patch", b"diff", "wrong_type", "string"),
        ("test_patch", "", "bad_value", "at least 1"),
        ("FAIL_TO_PASS", "test_a, test_b", "bad_value", "not a JSON list"),
        ("FAIL_TO_PASS", "{}", "wrong_type", "list"),
        ("FAIL_TO_PASS", [], "bad_value", "at least 1"),
        ("FAIL_TO_PASS", "[]", "bad_value", "at least 1"),
        ("PASS_TO_PASS", None, "wrong_type", "list"),
        ("PASS_TO_PASS", ["ok", 3], "wrong_type", "PASS_TO_PASS[1]"),
        ("environment_setup_commit", 5, "wrong_type", "string"),
        ("responses_create_params", "[]", "wrong_type", "object"),
    ],
)
def test_type_and_value_rules(sympy_copy: dict[str, Any], field: str, value: Any, rule: str, words: str) -> None:
    sympy_copy[field] = value
    problems = problems_of(sympy_copy)
    assert [(p.field, p.rule) for p in problems] == [(field, rule)]
    assert words in problems[0].message


def test_all_problems_of_a_row_are_reported(sympy_copy: dict[str, Any]) -> None:
    del sympy_copy["repo"]
    sympy_copy["version"] = 3
    assert {p.field for p in problems_of(sympy_copy)} == {"repo", "version"}


def test_test_lists_as_json_strings_become_lists(sympy_copy: dict[str, Any]) -> None:
    expected_f2p, expected_p2p = sympy_copy["FAIL_TO_PASS"], sympy_copy["PASS_TO_PASS"]
    sympy_copy["FAIL_TO_PASS"] = json.dumps(expected_f2p)
    sympy_copy["PASS_TO_PASS"] = json.dumps(expected_p2p)
    instance = validate_instance(sympy_copy)
    assert isinstance(instance, SweBenchInstance)
    assert (expected_f2p, expected_p2p) == (instance.FAIL_TO_PASS, instance.PASS_TO_PASS)


def test_optional_fields_may_be_absent_or_null(sympy_copy: dict[str, Any]) -> None:
    for field in ("hints_text", "environment_setup_commit", "responses_create_params", "subset", "split"):
        sympy_copy.pop(field)
    sympy_copy["hints_text"] = None
    assert isinstance(validate_instance(sympy_copy), SweBenchInstance)


@pytest.mark.parametrize(
    ("name", "subset", "split"),
    [
        ("princeton-nlp/SWE-bench_Verified", "verified", "test"),
        ("princeton-nlp/SWE-bench_Lite", "verified", "test"),
        ("princeton-nlp/SWE-bench", "verified", "test"),
        ("SWE-bench/SWE-bench_Verified", "verified", "test"),
        ("SWE-Gym/SWE-Gym", "gym", "train"),
        ("/data/SWE-bench_Verified/data/test-00000-of-00001.parquet", "verified", "test"),
        ("/cache/datasets--princeton-nlp--SWE-bench_Lite/snapshots/ab12/data/x.parquet", "verified", "test"),
        ("swe_gym-train.jsonl", "gym", "train"),
        ("nebius/SWE-rebench", None, None),
        ("Multi-SWE-bench/multi_swe_bench", None, None),
        ("example.jsonl", None, None),
    ],
)
def test_dataset_name_inference(name: str, subset: str | None, split: str | None) -> None:
    assert infer_kind(name) == DatasetKind(subset, split)


def test_routing_precedence_flag_then_row_then_name(sympy_copy: dict[str, Any]) -> None:
    gym_name = DatasetKind("gym", "train")
    assert resolve_routing(sympy_copy, Routing(None, None, gym_name)) == ("verified", "test", False)
    assert resolve_routing(sympy_copy, Routing("gym", "train", gym_name)) == ("gym", "train", True)
    assert resolve_routing(sympy_copy, Routing("verified", "test", gym_name)) == ("verified", "test", False)
    del sympy_copy["subset"], sympy_copy["split"]
    assert resolve_routing(sympy_copy, Routing(None, None, gym_name)) == ("gym", "train", False)
    assert resolve_routing(
        {**sympy_copy, "subset": "verified"}, Routing(None, None, DatasetKind(None, None), "dev")
    ) == (
        "verified",
        "dev",
        False,
    )
    unknown = resolve_routing(sympy_copy, Routing(None, None, DatasetKind(None, None)))
    assert isinstance(unknown, list)
    assert unknown[0].field == "subset" and "--subset" in unknown[0].message


def test_row_subset_outside_the_known_values_is_refused(sympy_copy: dict[str, Any]) -> None:
    sympy_copy["subset"] = "lite"
    refused = resolve_routing(sympy_copy, Routing(None, None, DatasetKind(None, None)))
    assert isinstance(refused, list)
    assert refused[0].rule == "bad_value" and "'lite'" in refused[0].message
    assert resolve_routing(sympy_copy, Routing("verified", None, DatasetKind(None, None))) == (
        "verified",
        "test",
        True,
    )


def test_prompt_row_shape(sympy_copy: dict[str, Any]) -> None:
    original = copy.deepcopy(sympy_copy)
    sympy_copy["FAIL_TO_PASS"] = json.dumps(sympy_copy["FAIL_TO_PASS"])
    instance = validate_instance(sympy_copy)
    assert isinstance(instance, SweBenchInstance)
    converted = to_prompt_row(sympy_copy, instance, subset="gym", split="train", drop_fields={"hints_text"})
    assert converted["prompt"] == [{"role": "user", "content": original["problem_statement"]}]
    metadata = converted["metadata"]
    expected = {k: v for k, v in original.items() if k != "hints_text"} | {"subset": "gym", "split": "train"}
    assert metadata == expected
    assert sympy_copy["FAIL_TO_PASS"] == json.dumps(original["FAIL_TO_PASS"]), "input row must not be mutated"


def test_convert_row_public_api(sympy_copy: dict[str, Any]) -> None:
    del sympy_copy["subset"], sympy_copy["split"]
    converted = convert_row(sympy_copy, dataset_name="SWE-Gym/SWE-Gym")
    assert (converted["metadata"]["subset"], converted["metadata"]["split"]) == ("gym", "train")
    with pytest.raises(RowInvalidError) as refused:
        convert_row({**sympy_copy, "version": 1.0}, subset="verified")
    assert [p.field for p in refused.value.problems] == ["version"]
    with pytest.raises(ValueError, match="instance_id"):
        convert_row(sympy_copy, subset="verified", drop_fields=("instance_id",))


def test_converted_real_rows_are_accepted_by_the_request_builder(
    gym_example_rows: list[dict[str, Any]],
) -> None:
    for example in gym_example_rows:
        hf_shaped = {k: v for k, v in example.items() if k not in ("responses_create_params", "subset", "split")}
        hf_shaped["FAIL_TO_PASS"] = json.dumps(hf_shaped["FAIL_TO_PASS"])
        converted = json.loads(encode_row(convert_row(hf_shaped, dataset_name="princeton-nlp/SWE-bench_Verified")))
        body = build_run_body(converted["metadata"], {"temperature": 1.0}, policy_base_url="http://10.0.0.1:1/v1")
        assert body["instance_id"] == example["instance_id"]
        assert body["FAIL_TO_PASS"] == example["FAIL_TO_PASS"]
        assert (body["subset"], body["split"]) == ("verified", "test")


def test_encode_row_utf8_datetimes_and_nan() -> None:
    line = encode_row({"a": "naïve — ✓", "t": dt.datetime(2020, 1, 2, 3, 4, 5)})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line)["a"] == "naïve — ✓"
    assert json.loads(line)["t"] == "2020-01-02T03:04:05"
    with pytest.raises(ValueError):
        encode_row({"x": float("nan")})
    with pytest.raises(ValueError, match="set"):
        encode_row({"x": {1, 2}})


def test_routing_keys_and_secrets_in_a_row_never_reach_the_output(gym_example_rows: list[dict[str, Any]]) -> None:
    from miles_nemogym.data import convert_row

    row = {**gym_example_rows[0], "policy_api_key": "sk-in-data", "policy_base_url": "http://x/v1"}
    out = convert_row(row, subset="verified", split="test")
    assert "policy_api_key" not in out["metadata"] and "policy_base_url" not in out["metadata"]
    assert "sk-in-data" not in json.dumps(out)
