"""The converter end to end on real rows: readers, selection, holdout, atomic output, swebench."""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from miles_nemogym.data import (
    ConvertError,
    ConvertOptions,
    ConvertReport,
    convert,
)
from miles_nemogym.data._select import SwebenchMissingError
from miles_nemogym.data._sources import SourceError, open_source

NEMO_GYM_KEYS = ("responses_create_params", "subset", "split")


@pytest.fixture
def datasets_cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`datasets` keeps its lock files in this test's folder, not in the user's ~/.cache/huggingface."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


def hf_shaped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as the HF parquet holds them: no NeMo-Gym keys, test lists as JSON strings."""
    shaped = []
    for row in rows:
        plain = {k: v for k, v in row.items() if k not in NEMO_GYM_KEYS}
        plain["FAIL_TO_PASS"] = json.dumps(plain["FAIL_TO_PASS"])
        plain["PASS_TO_PASS"] = json.dumps(plain["PASS_TO_PASS"])
        shaped.append(plain)
    return shaped


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]], row_group_size: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def expected_output(row: dict[str, Any], subset: str, split: str) -> dict[str, Any]:
    metadata = {k: v for k, v in row.items()} | {"subset": subset, "split": split}
    return {"prompt": [{"role": "user", "content": row["problem_statement"]}], "metadata": metadata}


def run(tmp_path: Path, source: Path | str, **flags: Any) -> tuple[ConvertReport, Path]:
    output = flags.pop("output", tmp_path / "out" / "prompts.jsonl")
    report = convert(ConvertOptions(input=str(source), output=output, **flags))
    return report, output


def ids(path: Path) -> list[str]:
    return [row["metadata"]["instance_id"] for row in read_jsonl(path)]


# --- formats ---------------------------------------------------------------------------


def test_real_rows_from_jsonl(tmp_path: Path, example_jsonl: Path, example_rows: list[dict[str, Any]]) -> None:
    report, output = run(tmp_path, example_jsonl)
    assert read_jsonl(output) == [expected_output(row, "verified", "test") for row in example_rows]
    assert (report.rows_read, report.written, sum(report.skipped.values())) == (5, 5, 0)
    assert report.written_by_repo == {row["repo"]: 1 for row in example_rows}
    assert output.read_bytes().endswith(b"\n")
    mode = stat.S_IMODE(output.stat().st_mode)
    assert mode & stat.S_IRGRP, "output should get normal permissions, not mkstemp's 0600"


def test_real_rows_from_hf_shaped_parquet(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    source = write_parquet(tmp_path / "SWE-bench_Verified" / "test.parquet", hf_shaped(example_rows))
    report, output = run(tmp_path, source)
    assert report.source_kind == "parquet"
    expected = [
        expected_output({k: v for k, v in row.items() if k not in NEMO_GYM_KEYS}, "verified", "test")
        for row in example_rows
    ]
    assert read_jsonl(output) == expected


def test_json_array_and_json_lines_files(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    array_file = tmp_path / "rows.json"
    array_file.write_text(json.dumps(example_rows, indent=2), encoding="utf-8")
    lines_file = write_jsonl(tmp_path / "lines.json", example_rows)
    expected = [expected_output(row, "verified", "test") for row in example_rows]
    for source in (array_file, lines_file):
        _, output = run(tmp_path, source, output=tmp_path / f"{source.stem}.out.jsonl")
        assert read_jsonl(output) == expected


def test_json_rows_larger_than_the_read_chunk(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    big = [dict(row, problem_statement=row["problem_statement"] * 3000) for row in example_rows]  # >1 MiB rows
    source = tmp_path / "big.json"
    source.write_text(json.dumps(big), encoding="utf-8")
    _, output = run(tmp_path, source)
    assert [r["prompt"][0]["content"] for r in read_jsonl(output)] == [r["problem_statement"] for r in big]


def test_broken_json_array_is_a_source_error(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    source = tmp_path / "cut.json"
    source.write_text(json.dumps(example_rows)[:-400], encoding="utf-8")
    output = tmp_path / "out.jsonl"
    with pytest.raises(SourceError, match="not valid JSON after 4 rows"):
        run(tmp_path, source, output=output, on_error="skip")
    assert not output.exists()


DEEP = "[" * 100_000 + "]" * 100_000
"""JSON nested past the parser's recursion limit: RecursionError, not a JSONDecodeError."""


def test_a_row_nested_too_deeply_is_a_bad_row_not_a_crash(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    source = tmp_path / "deep.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in example_rows) + f'{{"x": {DEEP}}}\n')
    report, output = run(tmp_path, source, on_error="skip")
    assert ids(output) == [row["instance_id"] for row in example_rows]
    assert [str(problem) for problem in report.problems] == [
        f"row {len(example_rows) + 1} (line {len(example_rows) + 1}): not readable: JSON nested too deeply"
    ]
    deep_array = tmp_path / "deep.json"
    deep_array.write_text(f"[{json.dumps(example_rows[0])}, {DEEP}]")
    with pytest.raises(SourceError, match="row 2 is JSON nested too deeply"):
        run(tmp_path, deep_array, output=tmp_path / "never.jsonl", on_error="skip")
    assert not (tmp_path / "never.jsonl").exists()


def test_json_file_that_is_not_utf8_is_a_source_error(tmp_path: Path) -> None:
    source = tmp_path / "latin1.json"
    source.write_bytes('[{"problem_statement": "caf\u00e9"}]'.encode("latin-1"))
    with pytest.raises(SourceError, match="not UTF-8"):
        run(tmp_path, source, on_error="skip")


@pytest.mark.usefixtures("datasets_cache_in_tmp")
def test_local_dataset_folder_goes_through_load_dataset(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    folder = tmp_path / "SWE-bench_Verified"
    write_parquet(folder / "data" / "test-00000-of-00001.parquet", hf_shaped(example_rows[:3]))
    write_parquet(folder / "data" / "train-00000-of-00001.parquet", hf_shaped(example_rows[3:]))
    report, output = run(tmp_path, folder)
    assert report.source_kind == "folder"
    assert ids(output) == [row["instance_id"] for row in example_rows[:3]]
    assert {r["metadata"]["split"] for r in read_jsonl(output)} == {"test"}
    _, train = run(tmp_path, folder, split="train", output=tmp_path / "train.jsonl")
    assert ids(train) == [row["instance_id"] for row in example_rows[3:]]
    assert {r["metadata"]["split"] for r in read_jsonl(train)} == {"train"}
    with pytest.raises(SourceError, match="--split"):
        run(tmp_path, folder, split="dev", output=tmp_path / "dev.jsonl")


@pytest.mark.usefixtures("datasets_cache_in_tmp")
def test_folder_that_breaks_mid_stream_is_a_source_error(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    folder = tmp_path / "SWE-bench_Lite"
    folder.mkdir()
    write_jsonl(folder / "test-a.jsonl", example_rows[:3])
    write_jsonl(folder / "test-b.jsonl", [dict(row, FAIL_TO_PASS={"not": "a list"}) for row in example_rows[3:]])
    output = tmp_path / "out.jsonl"
    with pytest.raises(SourceError, match="reading failed after 3 rows"):
        run(tmp_path, folder, output=output, on_error="skip")
    assert not output.exists()


def test_unknown_inputs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file"):
        run(tmp_path, tmp_path / "missing.parquet")
    weird = tmp_path / "rows.csv"
    weird.write_text("a,b\n")
    with pytest.raises(SourceError, match=r"unsupported file type '\.csv'"):
        run(tmp_path, weird)


def test_reading_streams_and_stops_at_the_limit(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    source = tmp_path / "tail_is_garbage.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in example_rows[:2]) + "{not json\n" * 3, encoding="utf-8")
    report, output = run(tmp_path, source, limit=2)
    assert report.rows_read == 2 and report.stopped_early
    assert ids(output) == [row["instance_id"] for row in example_rows[:2]]


def test_parquet_reader_is_lazy(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    source = open_source(str(write_parquet(tmp_path / "x.parquet", hf_shaped(example_rows * 300), 64)), "test")
    assert source.total == 1500
    first = next(iter(source))
    assert first.index == 0 and first.data is not None and first.data["instance_id"] == example_rows[0]["instance_id"]


# --- validation and errors ----------------------------------------------------------------


def broken_rows(rows: list[dict[str, Any]]) -> list[Any]:
    bad = copy.deepcopy(rows[1])
    bad["version"] = 2.9
    return [rows[0], bad, "just a string", *rows[2:]]


def test_on_error_fail_writes_nothing_and_reports_each_bad_row(
    tmp_path: Path, example_rows: list[dict[str, Any]]
) -> None:
    source = write_jsonl(tmp_path / "broken.jsonl", broken_rows(example_rows))
    source.write_text(source.read_text() + "{oops\n")
    output = tmp_path / "out.jsonl"
    with pytest.raises(ConvertError) as failed:
        run(tmp_path, source, output=output)
    assert not output.exists()
    assert list(tmp_path.iterdir()) == [source], "no temporary files may be left behind"
    report = failed.value.report
    assert report.problem_count == 3 and not report.committed
    listed = [str(problem) for problem in report.problems]
    assert listed[0].startswith(f"row 2 (line 2) [{example_rows[1]['instance_id']}]: version")
    assert listed[1].startswith("row 3 (line 3): not a JSON object")
    assert listed[2].startswith("row 7 (line 7): not valid JSON")
    assert report.skipped["invalid: version wrong_type"] == 1


def test_on_error_skip_writes_the_good_rows(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    source = write_jsonl(tmp_path / "broken.jsonl", broken_rows(example_rows))
    report, output = run(tmp_path, source, on_error="skip")
    assert ids(output) == [row["instance_id"] for i, row in enumerate(example_rows) if i != 1]
    assert report.problem_count == 2 and report.skipped["invalid: unreadable row"] == 1


def test_duplicates_are_kept_once_and_reported(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    changed = dict(example_rows[0], problem_statement="second copy")
    source = write_jsonl(tmp_path / "dups.jsonl", [*example_rows, changed, example_rows[0]])
    report, output = run(tmp_path, source)
    assert ids(output) == [row["instance_id"] for row in example_rows]
    assert read_jsonl(output)[0]["prompt"][0]["content"] == example_rows[0]["problem_statement"]
    assert report.skipped["duplicate instance_id"] == 2
    assert [d.where for d in report.duplicates] == ["row 6 (line 6)", "row 7 (line 7)"]


def test_unknown_subset_is_refused_and_the_flag_fixes_it(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    source = write_jsonl(tmp_path / "plain.jsonl", hf_shaped(example_rows))
    with pytest.raises(ConvertError) as failed:
        run(tmp_path, source)
    assert failed.value.report.skipped["invalid: subset missing"] == 5
    report, output = run(tmp_path, source, subset="gym", split="train")
    assert {(r["metadata"]["subset"], r["metadata"]["split"]) for r in read_jsonl(output)} == {("gym", "train")}
    assert report.overridden_rows == 0


def test_explicit_subset_overrides_the_rows_own(tmp_path: Path, example_jsonl: Path) -> None:
    report, output = run(tmp_path, example_jsonl, subset="gym")
    assert {(r["metadata"]["subset"], r["metadata"]["split"]) for r in read_jsonl(output)} == {("gym", "test")}
    assert report.overridden_rows == 5


def test_nothing_selected_is_an_error_and_writes_nothing(tmp_path: Path, example_jsonl: Path) -> None:
    output = tmp_path / "out.jsonl"
    with pytest.raises(ConvertError, match="no rows to write"):
        run(tmp_path, example_jsonl, output=output, repos=("nobody/nothing",))
    assert not output.exists()


# --- atomic output ---------------------------------------------------------------------


def test_crash_mid_way_leaves_existing_output_untouched(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    source = write_jsonl(
        tmp_path / "many.jsonl", [dict(row, instance_id=f"x__y-{i}") for i in range(3) for row in example_rows] * 100
    )
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    output = out_dir / "prompts.jsonl"
    output.write_text("previous content\n")

    def crash(done: int, total: int | None) -> None:
        if done >= 400:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(ConvertOptions(input=str(source), output=output, shuffle=True, seed=1), progress=crash)
    assert output.read_text() == "previous content\n"
    assert [p.name for p in out_dir.iterdir()] == ["prompts.jsonl"], "temp and spool files must be removed"


def test_failed_run_leaves_no_file_and_no_folder_it_made(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    bad_last = [*example_rows, dict(example_rows[0], instance_id="z__z-1", FAIL_TO_PASS="not json")]
    source = write_jsonl(tmp_path / "bad_last.jsonl", bad_last)
    kept = tmp_path / "kept"
    kept.mkdir()
    output = tmp_path / "new" / "deeper" / "out.jsonl"
    with pytest.raises(ConvertError):
        run(tmp_path, source, output=output, holdout=1, holdout_output=kept / "eval" / "eval.jsonl")
    assert not (tmp_path / "new").exists()
    assert list(kept.iterdir()) == []  # its own folder made for the holdout is gone; kept/ was there before


# --- selection -------------------------------------------------------------------------


def test_repos_and_exclude_repos(tmp_path: Path, example_jsonl: Path, example_rows: list[dict[str, Any]]) -> None:
    report, output = run(tmp_path, example_jsonl, repos=("django/django,sympy/sympy", "nobody/none"))
    assert ids(output) == [r["instance_id"] for r in example_rows if r["repo"] in ("django/django", "sympy/sympy")]
    assert report.skipped["not in --repos"] == 3
    assert report.unmatched_repos == ["nobody/none"]
    report, output = run(tmp_path, example_jsonl, exclude_repos=("django/django", "sympy/sympy"))
    assert ids(output) == [r["instance_id"] for r in example_rows if r["repo"] not in ("django/django", "sympy/sympy")]
    assert report.skipped["in --exclude-repos"] == 2
    with pytest.raises(ValueError, match="both in --repos and --exclude-repos"):
        ConvertOptions(input=str(example_jsonl), output=tmp_path / "o.jsonl", repos=("a/b",), exclude_repos=("a/b",))


def test_instance_ids_file(tmp_path: Path, example_jsonl: Path, example_rows: list[dict[str, Any]]) -> None:
    wanted = tmp_path / "ids.txt"
    fifth, second = example_rows[4]["instance_id"], example_rows[1]["instance_id"]
    wanted.write_text(f"# eval set\n{fifth}\n\n{second}  # two\nghost__id-1\n")
    report, output = run(tmp_path, example_jsonl, instance_ids=wanted)
    assert ids(output) == [example_rows[1]["instance_id"], example_rows[4]["instance_id"]]
    assert report.skipped["not in --instance-ids"] == 3
    assert report.missing_instance_ids == ["ghost__id-1"]
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no instance ids"):
        run(tmp_path, example_jsonl, instance_ids=empty)


def test_limit(tmp_path: Path, example_jsonl: Path, example_rows: list[dict[str, Any]]) -> None:
    report, output = run(tmp_path, example_jsonl, limit=3)
    assert ids(output) == [row["instance_id"] for row in example_rows[:3]]
    assert (report.rows_read, report.stopped_early) == (3, True)
    with pytest.raises(ValueError):
        ConvertOptions(input=str(example_jsonl), output=tmp_path / "o.jsonl", limit=0)


def test_shuffle_is_a_seeded_permutation(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    many = [dict(row, instance_id=f"{row['instance_id']}-{i}") for i in range(20) for row in example_rows]
    source = write_jsonl(tmp_path / "many.jsonl", many)
    in_order = [row["instance_id"] for row in many]
    _, first = run(tmp_path, source, shuffle=True, seed=7, output=tmp_path / "a.jsonl")
    _, again = run(tmp_path, source, shuffle=True, seed=7, output=tmp_path / "b.jsonl")
    _, other = run(tmp_path, source, shuffle=True, seed=8, output=tmp_path / "c.jsonl")
    assert ids(first) == ids(again)
    assert sorted(ids(first)) == sorted(in_order) and ids(first) != in_order
    assert ids(other) != ids(first)


def test_shuffle_keeps_rows_intact_and_limits(
    tmp_path: Path, example_jsonl: Path, example_rows: list[dict[str, Any]]
) -> None:
    report, output = run(tmp_path, example_jsonl, shuffle=True, seed=3, limit=2)
    by_id = {row["instance_id"]: expected_output(row, "verified", "test") for row in example_rows}
    written = read_jsonl(output)
    assert len(written) == 2 and all(by_id[r["metadata"]["instance_id"]] == r for r in written)
    assert report.skipped["beyond --limit"] == 3 and report.seed == 3


def test_shuffle_without_seed_picks_and_reports_one(tmp_path: Path, example_jsonl: Path) -> None:
    report, _ = run(tmp_path, example_jsonl, shuffle=True)
    assert isinstance(report.seed, int)
    with pytest.raises(ValueError, match="--seed only applies with --shuffle"):
        ConvertOptions(input=str(example_jsonl), output=tmp_path / "o.jsonl", seed=1)


@pytest.mark.parametrize("shuffle", [False, True])
def test_holdout_is_disjoint(
    tmp_path: Path, example_jsonl: Path, example_rows: list[dict[str, Any]], shuffle: bool
) -> None:
    eval_file = tmp_path / "eval.jsonl"
    report, output = run(
        tmp_path, example_jsonl, holdout=2, holdout_output=eval_file, shuffle=shuffle, seed=5 if shuffle else None
    )
    train_ids, eval_ids = ids(output), ids(eval_file)
    assert len(eval_ids) == 2 and len(train_ids) == 3
    assert set(train_ids).isdisjoint(eval_ids)
    assert sorted(train_ids + eval_ids) == sorted(row["instance_id"] for row in example_rows)
    if not shuffle:
        assert eval_ids == [row["instance_id"] for row in example_rows[:2]]
    assert (report.holdout_written, report.written) == (2, 3)


def test_holdout_needs_enough_rows_and_both_flags(tmp_path: Path, example_jsonl: Path) -> None:
    eval_file, output = tmp_path / "eval.jsonl", tmp_path / "train.jsonl"
    with pytest.raises(ConvertError, match="nothing written"):
        run(tmp_path, example_jsonl, holdout=5, holdout_output=eval_file, output=output)
    with pytest.raises(ConvertError, match="fewer than --holdout 9"):
        run(tmp_path, example_jsonl, holdout=9, holdout_output=eval_file, output=output, shuffle=True)
    assert not eval_file.exists() and not output.exists()
    with pytest.raises(ValueError, match="--holdout-output FILE"):
        ConvertOptions(input=str(example_jsonl), output=output, holdout=1)
    with pytest.raises(ValueError, match="needs --holdout N"):
        ConvertOptions(input=str(example_jsonl), output=output, holdout_output=eval_file)
    with pytest.raises(ValueError, match="must differ from --output"):
        ConvertOptions(input=str(example_jsonl), output=output, holdout=1, holdout_output=output)
    with pytest.raises(ValueError, match="must differ from --input"):
        ConvertOptions(input=str(example_jsonl), output=example_jsonl)


def test_drop_fields(tmp_path: Path, example_jsonl: Path) -> None:
    _, output = run(tmp_path, example_jsonl, drop_fields=("hints_text,created_at", "difficulty"))
    for row in read_jsonl(output):
        assert not {"hints_text", "created_at", "difficulty"} & row["metadata"].keys()
        assert "environment_setup_commit" in row["metadata"]
    for required in ("FAIL_TO_PASS", "patch", "subset"):
        with pytest.raises(ValueError, match=f"cannot drop {required}"):
            ConvertOptions(input=str(example_jsonl), output=tmp_path / "o.jsonl", drop_fields=(required,))


# --- --gradeable-only against the real swebench ----------------------------------------


def test_gradeable_only_uses_the_real_swebench_tables(tmp_path: Path, example_rows: list[dict[str, Any]]) -> None:
    moto = dict(example_rows[0], instance_id="getmoto__moto-5752", repo="getmoto/moto", version="4.0", subset="gym")
    future = dict(example_rows[0], instance_id="django__django-99999", version="99.0")
    source = write_jsonl(tmp_path / "mixed.jsonl", [example_rows[0], moto, future, example_rows[3]])
    report, output = run(tmp_path, source, gradeable_only=True)
    assert ids(output) == [example_rows[0]["instance_id"], example_rows[3]["instance_id"]]
    assert report.skipped["not gradeable: repo unknown to swebench"] == 1
    assert report.skipped["not gradeable: version unknown to swebench"] == 1
    assert report.not_gradeable_by_repo == {"getmoto/moto": 1, "django/django": 1}
    assert report.swebench_version == "4.1.0"


def test_gradeable_only_without_swebench_names_the_install_command(
    tmp_path: Path, example_jsonl: Path, swebench_missing: None
) -> None:
    output = tmp_path / "out.jsonl"
    with pytest.raises(SwebenchMissingError, match=r"pip install 'swebench==4\.1\.0'"):
        run(tmp_path, example_jsonl, gradeable_only=True, output=output)
    assert not output.exists()
    assert os.listdir(tmp_path) == [example_jsonl.name]
