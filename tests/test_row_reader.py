"""One row reader and one --instance-ids grammar: convert, scan and the launcher read inputs alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.data import ConvertOptions, convert, decode_test_lists
from miles_nemogym.data._select import instance_ids_option, parse_instance_ids
from miles_nemogym.data._sources import open_source
from miles_nemogym.launcher._checks import check_prompt_data
from miles_nemogym.launcher._config import LauncherConfig
from miles_nemogym.scan._inputs import InputError, load_tasks, select


def _file(tmp_path: Path, second_line: str) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"instance_id": "a__b-1"}\n\n' + second_line + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("[1, 2]", "not a JSON object (got list)"),
        ("{oops", "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ],
)
def test_a_bad_line_reads_the_same_everywhere(tmp_path: Path, line: str, error: str) -> None:
    path = _file(tmp_path, line)
    rows = list(open_source(str(path), "test"))
    assert [(row.index, row.line, row.error) for row in rows] == [(0, 1, None), (1, 3, error)]

    with pytest.raises(InputError) as scan:
        load_tasks(path, subset="verified")
    assert str(scan.value).startswith(f"{path}:3: {error}; ")

    launcher = check_prompt_data(LauncherConfig(prompt_data=path, megatron_path=tmp_path))
    assert launcher.detail == f"--prompt-data {path}: row 2 (line 3): {error}"


def test_fail_to_pass_is_decoded_once_for_converter_and_scan() -> None:
    row: dict[str, Any] = {"FAIL_TO_PASS": '["t1", "t2"]', "PASS_TO_PASS": []}
    decode_test_lists(row)
    assert row == {"FAIL_TO_PASS": ["t1", "t2"], "PASS_TO_PASS": []}
    with pytest.raises(ValueError, match=r"^FAIL_TO_PASS: is a string but not a JSON list of test names"):
        decode_test_lists({"FAIL_TO_PASS": "[broken"})
    with pytest.raises(ValueError, match=r"^PASS_TO_PASS: Input should be a valid list \(got int 3\); give a list"):
        decode_test_lists({"PASS_TO_PASS": 3})


def test_convert_and_scan_read_one_instance_ids_grammar(tmp_path: Path, gym_example_rows: list[dict[str, Any]]) -> None:
    rows = [{**row, "subset": "verified", "split": "test"} for row in gym_example_rows]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    wanted = tmp_path / "ids.txt"
    wanted.write_text(
        f"# eval set\n{rows[3]['instance_id']}, {rows[1]['instance_id']}  # two\n\n{rows[1]['instance_id']}\n"
    )
    assert parse_instance_ids(str(wanted)) == [rows[3]["instance_id"], rows[1]["instance_id"]]
    option = instance_ids_option(str(wanted))
    assert option == wanted

    output = tmp_path / "out.jsonl"
    convert(ConvertOptions(input=str(source), output=output, instance_ids=option))
    converted = [json.loads(line)["metadata"]["instance_id"] for line in output.read_text().splitlines()]
    scanned = [task.instance_id for task in select(load_tasks(source), parse_instance_ids(str(wanted)), None)]
    assert converted == scanned == [rows[1]["instance_id"], rows[3]["instance_id"]]

    empty = tmp_path / "empty.txt"
    empty.write_text("# none\n")
    message = f"--instance-ids {empty}: holds no instance ids (one per line expected)"
    with pytest.raises(ValueError) as scan:
        parse_instance_ids(str(empty))
    with pytest.raises(ValueError) as converter:
        convert(ConvertOptions(input=str(source), output=output, instance_ids=instance_ids_option(str(empty))))
    assert str(scan.value) == str(converter.value) == message
