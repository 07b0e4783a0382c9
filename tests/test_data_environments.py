"""``convert`` on NeMo-Gym environment task rows: the real rows nemo-gym 0.7.0 ships per resources
server, their prompt and marks, the environment from ``agent_ref``, bad rows, weighted mixing and
the holdout per environment."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.data import ConvertError, ConvertOptions, ConvertReport, convert, convert_row
from miles_nemogym.data._convert import RowInvalidError
from miles_nemogym.data._environments import EnvironmentInput, apportion, parse_env_option
from tests.support.environment_rows import shipped_rows, shipped_text
from tests.support.limited_cli import run_limited
from tests.support.prompt_rows import write_jsonl


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def shipped_file(tmp_path: Path, environment: str) -> Path:
    path = tmp_path / f"{environment}.jsonl"
    path.write_bytes(shipped_text(environment))
    return path


def run(tmp_path: Path, *entries: EnvironmentInput, **flags: Any) -> tuple[ConvertReport, Path]:
    output = flags.pop("output", tmp_path / "out" / "train.jsonl")
    return convert(ConvertOptions(output=output, environments=entries, **flags)), output


def task_ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["metadata"]["nemogym_task_id"] for row in rows]


# --- one row: prompt, metadata, marks --------------------------------------------------------


def test_real_rows_become_prompt_rows_with_the_task_row_as_metadata(tmp_path: Path) -> None:
    rows = shipped_rows("xlam_fc")
    report, output = run(tmp_path, EnvironmentInput("xlam_fc", str(shipped_file(tmp_path, "xlam_fc"))))
    written = read_jsonl(output)
    assert report.written == len(rows) == len(written) and report.written_by_env == {"xlam_fc": len(rows)}
    for row, out in zip(rows, written, strict=True):
        params = row["responses_create_params"]
        assert out["prompt"] == [{"role": item["role"], "content": item["content"]} for item in params["input"]]
        assert out["metadata"] == row | {"nemogym_env": "xlam_fc", "nemogym_task_id": f"xlam_fc/{row['id']}"}


def test_a_string_input_is_one_user_message_after_the_instructions(tmp_path: Path) -> None:
    # google_search ships rows with a string input and instructions.
    row = shipped_rows("google_search")[0]
    _, output = run(tmp_path, EnvironmentInput("google_search", str(shipped_file(tmp_path, "google_search"))))
    params = row["responses_create_params"]
    assert read_jsonl(output)[0]["prompt"] == [
        {"role": "system", "content": params["instructions"]},
        {"role": "user", "content": params["input"]},
    ]


def test_mcqa_rows_are_known_by_their_uuid_and_rows_without_an_id_by_their_index(tmp_path: Path) -> None:
    mcqa = shipped_rows("mcqa")
    _, output = run(
        tmp_path,
        EnvironmentInput("mcqa", str(shipped_file(tmp_path, "mcqa"))),
        EnvironmentInput("rule", str(shipped_file(tmp_path, "equivalence_rule"))),
    )
    assert task_ids(read_jsonl(output)) == [f"mcqa/{row['uuid']}" for row in mcqa] + [f"rule/{i}" for i in range(5)]


def test_convert_row_converts_one_environment_row_as_convert_does(tmp_path: Path) -> None:
    _, output = run(tmp_path, EnvironmentInput("rule", str(shipped_file(tmp_path, "equivalence_rule"))))
    rows = shipped_rows("equivalence_rule")
    assert [convert_row(row, environment="rule", index=i) for i, row in enumerate(rows)] == read_jsonl(output)
    with pytest.raises(ValueError, match=r"^responses_create_params: must be an object"):
        convert_row({"id": 1}, environment="rule")
    with pytest.raises(ValueError, match="for SWE-bench rows"):
        convert_row(rows[0], environment="rule", subset="verified")


def test_routing_keys_in_a_row_are_never_written(tmp_path: Path) -> None:
    rows = shipped_rows("mcqa")
    rows[0] |= {"policy_base_url": "http://attacker:1/v1", "policy_api_key": "sk-secret-in-data"}
    _, output = run(tmp_path, EnvironmentInput("mcqa", str(write_jsonl(tmp_path / "rows.jsonl", rows))))
    text = output.read_text()
    assert "sk-secret-in-data" not in text and "attacker" not in text
    assert read_jsonl(output)[0]["metadata"]["expected_answer"] == rows[0]["expected_answer"]


# --- the environment of a row ----------------------------------------------------------------


def test_the_environment_comes_from_agent_ref_or_task_source_without_simple_agent(tmp_path: Path) -> None:
    # equivalence_rule ships rows with agent_ref lc_equivalence_rule_simple_agent; NeMo-Gym 0.7.0's
    # data preparation writes task_source (the declaring agent) instead.
    rule = shipped_rows("equivalence_rule")
    prepared = [
        {k: v for k, v in row.items() if k != "agent_ref"} | {"task_source": "mcqa_simple_agent"}
        for row in shipped_rows("mcqa")
    ]
    source = write_jsonl(tmp_path / "prepared.jsonl", rule + prepared)
    report, output = (
        convert(ConvertOptions(input=str(source), output=tmp_path / "train.jsonl")),
        tmp_path / "train.jsonl",
    )
    envs = [row["metadata"]["nemogym_env"] for row in read_jsonl(output)]
    assert envs == ["lc_equivalence_rule"] * 5 + ["mcqa"] * 5
    assert report.usable_by_env == {"lc_equivalence_rule": 5, "mcqa": 5}
    assert read_jsonl(output)[0]["metadata"]["agent_ref"] == rule[0]["agent_ref"]  # the row as is


def test_a_row_naming_no_simple_agent_environment_is_refused_and_env_names_it(tmp_path: Path) -> None:
    wordle = shipped_file(tmp_path, "wordle")  # agent_ref wordle_gymnasium_agent
    with pytest.raises(ConvertError) as caught:
        convert(ConvertOptions(input=str(wordle), output=tmp_path / "out.jsonl"))
    problem = caught.value.report.problems[0]
    assert problem.where == "row 1 (line 1)"
    assert "agent_ref.name: is 'wordle_gymnasium_agent'" in str(problem) and "--env NAME" in str(problem)
    mcqa = shipped_file(tmp_path, "mcqa")  # no agent_ref at all
    with pytest.raises(ConvertError) as unnamed:
        convert(ConvertOptions(input=str(mcqa), output=tmp_path / "out.jsonl"))
    assert "agent_ref: is missing" in str(unnamed.value.report.problems[0])
    report = convert(
        ConvertOptions(
            input=str(mcqa), output=tmp_path / "out.jsonl", environments=(parse_env_option("mcqa", str(mcqa)),)
        )
    )
    assert report.written_by_env == {"mcqa": 5}


def test_swe_bench_rows_that_carry_responses_create_params_stay_swe_rows(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    assert all("responses_create_params" in row for row in gym_example_rows)
    source = write_jsonl(tmp_path / "swe.jsonl", gym_example_rows)
    report = convert(ConvertOptions(input=str(source), output=tmp_path / "out.jsonl"))
    assert not report.environments and report.written == len(gym_example_rows)
    assert "nemogym_env" not in read_jsonl(tmp_path / "out.jsonl")[0]["metadata"]


# --- bad rows ----------------------------------------------------------------------------------


def test_unusable_inputs_are_reported_by_row_and_field_and_nothing_is_written(tmp_path: Path) -> None:
    citation = shipped_rows("citation_if")[0]  # function_call items in its input
    circle = shipped_rows("circle_count")[0]  # an input_image part
    good = shipped_rows("mcqa")
    missing = {k: v for k, v in good[1].items() if k != "responses_create_params"}
    empty = copy.deepcopy(good[2]) | {"responses_create_params": {"input": []}}
    built_in = shipped_rows("xlam_fc")[0]  # a Responses built-in tool the episode cannot offer
    built_in["responses_create_params"]["tools"] = [{"type": "web_search_preview"}]
    rows = [good[0], citation, circle, missing, empty, built_in, good[3]]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    output = tmp_path / "out.jsonl"
    with pytest.raises(ConvertError) as caught:
        run(tmp_path, EnvironmentInput("mixed", str(source)), output=output)
    problems = [str(problem) for problem in caught.value.report.problems]
    assert problems[0].startswith("row 2 (line 2) [mixed/1]: responses_create_params.input[2]: must be a message")
    assert problems[1].startswith(
        "row 3 (line 3) [mixed/2]: responses_create_params.input[1].content[0]: is a 'input_image' part"
    )
    assert problems[2].startswith("row 4 (line 4) [mixed/")
    assert "responses_create_params: must be an object" in problems[2]
    assert problems[3].startswith("row 5 (line 5)") and "input: is missing or empty" in problems[3]
    assert problems[4].startswith("row 6 (line 6) [mixed/0]: responses_create_params.tools[0]: must be a function tool")
    assert not output.exists()
    report, _ = run(tmp_path, EnvironmentInput("mixed", str(source)), output=output, on_error="skip")
    assert report.written == 2 and report.skipped["invalid: responses_create_params missing"] == 1
    assert report.skipped["invalid: responses_create_params.input[] unusable"] == 1


def test_nothing_usable_is_an_error(tmp_path: Path) -> None:
    source = write_jsonl(
        tmp_path / "rows.jsonl", [{"question": "no params"}, {"responses_create_params": {"input": ""}}]
    )
    with pytest.raises(ConvertError, match="no usable rows"):
        run(tmp_path, EnvironmentInput("mcqa", str(source)), on_error="skip")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_duplicate_task_ids_are_kept_once(tmp_path: Path) -> None:
    rows = shipped_rows("xlam_fc")
    source = write_jsonl(tmp_path / "rows.jsonl", rows + rows[:2])
    report, output = run(tmp_path, EnvironmentInput("xlam_fc", str(source)))
    assert report.skipped["duplicate task id"] == 2 and len(read_jsonl(output)) == 5
    assert len(set(task_ids(read_jsonl(output)))) == 5


# --- mixing and holdout --------------------------------------------------------------------------


def test_weights_split_a_size_and_repeats_carry_a_copy_number(tmp_path: Path) -> None:
    mcqa, xlam = str(shipped_file(tmp_path, "mcqa")), str(shipped_file(tmp_path, "xlam_fc"))
    entries = (EnvironmentInput("mcqa", mcqa, 3), EnvironmentInput("xlam_fc", xlam, 1))
    report, output = run(tmp_path, *entries, size=20, seed=7)
    rows = read_jsonl(output)
    envs = [row["metadata"]["nemogym_env"] for row in rows]
    assert envs.count("mcqa") == 15 and envs.count("xlam_fc") == 5
    assert report.repeated_by_env == {"mcqa": 10, "xlam_fc": 0}
    ids = task_ids(rows)
    assert len(set(ids)) == 20 and sum(task_id.endswith("#3") for task_id in ids) == 5  # each mcqa row 3 times
    assert envs != sorted(envs, key=lambda env: env != "mcqa")  # interleaved, not in blocks
    again, other = tmp_path / "again.jsonl", tmp_path / "other.jsonl"
    run(tmp_path, *entries, size=20, seed=7, output=again)
    run(tmp_path, *entries, size=20, seed=8, output=other)
    assert again.read_bytes() == output.read_bytes() and other.read_bytes() != output.read_bytes()


def test_weights_without_a_size_take_the_most_rows_without_repeats(tmp_path: Path) -> None:
    rows = shipped_rows("xlam_fc")
    big = write_jsonl(tmp_path / "big.jsonl", [dict(rows[i % 5], id=i) for i in range(40)])
    entries = (
        EnvironmentInput("mcqa", str(shipped_file(tmp_path, "mcqa")), 1),
        EnvironmentInput("xlam_fc", str(big), 3),
    )
    report, output = run(tmp_path, *entries, seed=1)
    assert report.written_by_env == {"mcqa": 5, "xlam_fc": 15}  # mcqa's 5 rows are a quarter
    assert report.skipped["not picked by the weights"] == 25
    assert len(set(task_ids(read_jsonl(output)))) == 20 and not any("#" in t for t in task_ids(read_jsonl(output)))


def test_apportion_keeps_the_total_and_each_share_within_one() -> None:
    assert apportion(7, [0.5, 0.25]) == [5, 2]
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]
    counts = apportion(1001, [0.1, 0.2, 0.7])
    assert sum(counts) == 1001 and all(abs(c - 1001 * w) < 1 for c, w in zip(counts, [0.1, 0.2, 0.7], strict=True))


def test_holdout_per_environment_goes_to_its_own_eval_file_disjoint_from_train(tmp_path: Path) -> None:
    entries = (
        EnvironmentInput("mcqa", str(shipped_file(tmp_path, "mcqa"))),
        EnvironmentInput("xlam_fc", str(shipped_file(tmp_path, "xlam_fc"))),
    )
    report, output = run(tmp_path, *entries, holdout=2, holdout_output=tmp_path / "eval" / "{env}.jsonl", seed=3)
    train = set(task_ids(read_jsonl(output)))
    for env in ("mcqa", "xlam_fc"):
        held = read_jsonl(tmp_path / "eval" / f"{env}.jsonl")
        assert len(held) == 2 and {row["metadata"]["nemogym_env"] for row in held} == {env}
        assert not set(task_ids(held)) & train
    assert len(train) == 6 and report.holdout_by_env == {"mcqa": 2, "xlam_fc": 2}
    assert report.holdout_files == {env: tmp_path / "eval" / f"{env}.jsonl" for env in ("mcqa", "xlam_fc")}
    one = tmp_path / "eval.jsonl"
    run(tmp_path, *entries, holdout=1, holdout_output=one, seed=3, output=tmp_path / "t2.jsonl")
    assert sorted(row["metadata"]["nemogym_env"] for row in read_jsonl(one)) == ["mcqa", "xlam_fc"]
    prepared = write_jsonl(
        tmp_path / "mcqa.jsonl", [row | {"task_source": "mcqa_simple_agent"} for row in shipped_rows("mcqa")]
    )
    before = prepared.read_bytes()
    with pytest.raises(ValueError, match="is an input or another output"):  # {env} of the rows names the input
        convert(
            ConvertOptions(
                input=str(prepared), output=tmp_path / "t4.jsonl", holdout=1, holdout_output=tmp_path / "{env}.jsonl"
            )
        )
    assert prepared.read_bytes() == before and not (tmp_path / "t4.jsonl").exists()
    with pytest.raises(ConvertError, match="mcqa: 5 usable row"):
        run(tmp_path, *entries, holdout=5, holdout_output=one, output=tmp_path / "t3.jsonl")
    assert not (tmp_path / "t3.jsonl").exists()


# --- the command -----------------------------------------------------------------------------------


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, [*map(str, args)])


def test_the_command_mixes_and_prints_counts_per_environment(tmp_path: Path) -> None:
    mcqa, xlam = shipped_file(tmp_path, "mcqa"), shipped_file(tmp_path, "xlam_fc")
    result = invoke(
        "convert", "--env", f"mcqa={mcqa}:0.5", "--env", f"xlam_fc={xlam}:0.5", "--size", "8",
        "--holdout", "1", "--holdout-output", tmp_path / "eval" / "{env}.jsonl", "--seed", "0",
        "-o", tmp_path / "mix.jsonl",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "per environment" in result.stdout and "random choices made with seed 0" in result.stdout
    assert "to repeat" not in result.stdout  # the user gave the seed
    assert f"held out to {tmp_path / 'eval' / 'mcqa.jsonl'}" in " ".join(result.stdout.split())
    assert len(read_jsonl(tmp_path / "mix.jsonl")) == 8


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--env", "mcqa={mcqa}:0"], "weight must be a number > 0"),
        # A weight that is no number was taken as part of the file name ('...jsonl:abc', no such file).
        (["--env", "mcqa={mcqa}:abc"], "(got 'abc' after the last ':'); use --env NAME=FILE[:WEIGHT]"),
        (["--env", "mcqa={mcqa}:1", "--env", "xlam_fc={mcqa}"], "give every --env a weight"),
        (["--env", "mcqa={mcqa}", "--size", "3"], "--size needs a weight"),
        (["--env", "mcqa={mcqa}", "--limit", "3"], "--limit: SWE-bench flags"),
        (["--input", "{mcqa}", "--env", "swe"], "'swe' is reserved"),
        (["--env", "mcqa={mcqa}", "--env", "mcqa={mcqa}"], "given twice"),
        (["--env", "mcqa"], "pass --input FILE"),
        (["--env", "mcqa={mcqa}", "--holdout", "1", "--holdout-output", "{mcqa}"], "must differ from --env mcqa"),
    ],
)
def test_bad_environment_flags_exit_2(tmp_path: Path, flags: list[str], message: str) -> None:
    mcqa = shipped_file(tmp_path, "mcqa")
    result = invoke("convert", "-o", tmp_path / "out.jsonl", *(flag.format(mcqa=mcqa) for flag in flags))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out.jsonl").exists()


def test_examples_env_writes_the_shipped_rows_and_names_unknown_ones(tmp_path: Path) -> None:
    result = invoke("examples", "--env", "workplace_assistant", "-o", tmp_path / "wa.jsonl")
    assert result.exit_code == 0, result.output
    shipped = shipped_text("workplace_assistant")
    assert not shipped.endswith(b"\n")  # nemo-gym's file; the written one ends its last line
    assert (tmp_path / "wa.jsonl").read_bytes() == shipped + b"\n"
    unknown = invoke("examples", "--env", "no_such_env")
    assert unknown.exit_code == 2 and "'no_such_env' is not an environment nemo-gym ships" in unknown.output


def test_examples_env_suggests_close_names_on_one_line() -> None:
    typo = invoke("examples", "--env", "mcq")
    assert typo.exit_code == 2
    said = typo.stderr.strip()
    assert "(did you mean mcqa" in said and "\n" not in said
    assert len(said) <= 80, said  # a refusal fits 80 columns, in a pipe too


def test_convert_refuses_an_env_name_nemo_gym_does_not_ship_unless_it_is_yours(tmp_path: Path) -> None:
    rows = shipped_file(tmp_path, "mcqa")
    out = tmp_path / "out.jsonl"
    typo = invoke("convert", "--env", f"mcq={rows}", "-o", out, "--quiet")
    assert typo.exit_code == 2 and not out.exists()
    said = " ".join(typo.stderr.split())
    assert "'mcq' is not an environment nemo-gym ships (did you mean mcqa" in said
    assert "--own-env NAME" in said
    own = invoke("convert", "--env", f"mcq={rows}", "--own-env", "mcq", "-o", out, "--quiet")
    assert own.exit_code == 0, own.output
    assert all(json.loads(line)["metadata"]["nemogym_env"] == "mcq" for line in out.read_text().splitlines())
    stray = invoke("convert", "--env", f"mcqa={rows}", "--own-env", "mcq", "-o", tmp_path / "o2.jsonl")
    assert stray.exit_code == 2 and "--own-env mcq: no --env names 'mcq'" in stray.stderr
    shipped = invoke("convert", "--env", f"mcqa={rows}", "-o", tmp_path / "o3.jsonl", "--quiet")
    assert shipped.exit_code == 0, shipped.output


def test_converted_swe_rows_mix_in_as_is_and_raw_ones_are_refused(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    swe_rows = [convert_row(row) for row in gym_example_rows]
    swe = write_jsonl(tmp_path / "swe.jsonl", swe_rows)
    entries = (EnvironmentInput("swe", str(swe), 1), EnvironmentInput("mcqa", str(shipped_file(tmp_path, "mcqa")), 1))
    report, output = run(
        tmp_path, *entries, size=14, holdout=1, holdout_output=tmp_path / "eval" / "{env}.jsonl", seed=2
    )
    rows = read_jsonl(output)
    written_swe = [row for row in rows if "nemogym_env" not in row["metadata"]]
    assert len(written_swe) == 7 and report.repeated_by_env == {"swe": 3, "mcqa": 3}
    assert all(row in swe_rows for row in written_swe)  # unchanged, unmarked: they go to NEMO_GYM_URL's /run
    held = read_jsonl(tmp_path / "eval" / "swe.jsonl")
    assert len(held) == 1 and held[0] in swe_rows and held[0] not in written_swe
    raw = write_jsonl(tmp_path / "raw.jsonl", gym_example_rows)
    with pytest.raises(ConvertError) as caught:
        run(tmp_path, EnvironmentInput("swe", str(raw), 1), output=tmp_path / "t.jsonl")
    assert "convert them first" in str(caught.value.report.problems[0])
    broken = copy.deepcopy(swe_rows[0])
    del broken["metadata"]["test_patch"]
    with pytest.raises(ConvertError) as missing:
        run(
            tmp_path,
            EnvironmentInput("swe", str(write_jsonl(tmp_path / "b.jsonl", [broken])), 1),
            output=tmp_path / "t.jsonl",
        )
    assert "metadata.test_patch" in str(missing.value.report.problems[0])


def test_convert_output_of_rows_marked_swe_mixes_in_and_other_marks_are_refused(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    marked = [convert_row(dict(row, nemogym_env="swe")) for row in gym_example_rows]
    swe = write_jsonl(tmp_path / "swe.jsonl", marked)
    _, output = run(tmp_path, EnvironmentInput("swe", str(swe), 1), output=tmp_path / "o.jsonl")
    assert sorted(map(json.dumps, read_jsonl(output))) == sorted(map(json.dumps, marked))
    marked[0]["metadata"]["nemogym_env"] = "mcqa"
    other = write_jsonl(tmp_path / "other.jsonl", marked)
    with pytest.raises(ConvertError) as caught:
        run(tmp_path, EnvironmentInput("swe", str(other), 1), output=tmp_path / "t.jsonl")
    assert "nemogym_env: is 'mcqa': swe=FILE takes convert's output" in str(caught.value.report.problems[0])


def test_a_size_past_the_bound_names_the_flag_the_limit_and_the_fix(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    # 10 rows with --size 200000000 would have taken ~17 GB of memory and ~580 GB of output: in a child
    # process with both limited, so that a converter without the bound fails here instead of the machine.
    rows = write_jsonl(tmp_path / "rows.jsonl", shipped_rows("mcqa"))
    for size in ("200000000", "1000001"):
        done = run_limited(
            "convert", "--env", f"mcqa={rows}:1", "--size", size, "-o", tmp_path / "out.jsonl",
            file_size=50_000_000, memory=2_000_000_000, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        said = " ".join(done.stderr.split())
        assert f"--size {size} is more than 1000000" in said and "give --size 1000000 or less" in said
        assert "Miles' --num-epoch" in said
        assert not (tmp_path / "out.jsonl").exists()
    swe_rows = write_jsonl(tmp_path / "swe.jsonl", gym_example_rows)
    swe = invoke("convert", "-i", swe_rows, "--size", "3", "-o", tmp_path / "out.jsonl")  # was silently ignored
    assert swe.exit_code == 2 and "--size is for NeMo-Gym environment rows (--env)" in swe.stderr


def test_user_text_is_printed_as_is_never_as_rich_markup_or_emoji(tmp_path: Path) -> None:
    odd = tmp_path / "rows[bold]:smile:.jsonl"
    odd.write_bytes(shipped_text("mcqa"))
    result = invoke("convert", "--env", f"mcqa={odd}", "-o", tmp_path / "out.jsonl", "--quiet")
    assert result.exit_code == 0, result.output
    assert f"convert: {odd} (NeMo-Gym environment rows)" in result.stdout
    missing = invoke("convert", "--env", f"mcqa={tmp_path / 'no:abc:'}:abc", "-o", tmp_path / "out.jsonl")
    assert missing.exit_code == 2, missing.output
    assert ":abc:" in missing.stderr and "\N{INPUT SYMBOL FOR LATIN LETTERS}" not in missing.stderr  # not an emoji
    # A ':' in an existing file's name is part of the name, not a weight.
    colon = tmp_path / "mcqa:rows.jsonl"
    colon.write_bytes(shipped_text("mcqa"))
    named = invoke("convert", "--env", f"mcqa={colon}", "-o", tmp_path / "colon.jsonl", "--quiet")
    assert named.exit_code == 0, named.output
    assert len(read_jsonl(tmp_path / "colon.jsonl")) == len(shipped_rows("mcqa"))


@pytest.mark.parametrize("mark", [7, "", None, ["mcqa"]])
def test_a_rows_own_nemogym_env_that_names_no_environment_is_refused_by_row_and_field(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]], mark: Any
) -> None:
    # The trainer runs a row whose mark is no name as a SWE-bench row.
    rows = shipped_rows("mcqa")
    rows[1]["nemogym_env"] = mark
    with pytest.raises(ConvertError) as caught:
        run(tmp_path, EnvironmentInput("mcqa", str(write_jsonl(tmp_path / "rows.jsonl", rows))))
    assert caught.value.report.problem_count == 1
    assert f"row 2 (line 2) [mcqa/{rows[1]['uuid']}]: nemogym_env: is {mark!r}, not an environment's name" in str(
        caught.value.report.problems[0]
    )
    swe = write_jsonl(tmp_path / "swe.jsonl", [gym_example_rows[0], dict(gym_example_rows[1], nemogym_env=mark)])
    with pytest.raises(ConvertError) as refused:
        convert(ConvertOptions(input=str(swe), output=tmp_path / "swe_out.jsonl"))
    assert "row 2 (line 2)" in str(refused.value.report.problems[0])
    assert f"nemogym_env: is {mark!r}" in str(refused.value.report.problems[0])
    assert not (tmp_path / "swe_out.jsonl").exists()


def test_a_swe_bench_row_marked_for_another_environment_is_refused(gym_example_rows: list[dict[str, Any]]) -> None:
    with pytest.raises(RowInvalidError, match="nemogym_env: is 'mcqa' on a SWE-bench row"):
        convert_row(dict(gym_example_rows[0], nemogym_env="mcqa"))
    assert convert_row(dict(gym_example_rows[0], nemogym_env="swe"))["metadata"]["nemogym_env"] == "swe"


def test_gymnasium_rows_convert_under_their_named_environment_and_unnamed_ones_say_how(tmp_path: Path) -> None:
    blackjack = shipped_file(tmp_path, "blackjack")
    done = invoke("convert", "--env", f"blackjack={blackjack}", "-o", tmp_path / "out.jsonl")
    assert done.exit_code == 0, done.output
    rows = read_jsonl(tmp_path / "out.jsonl")
    assert len(rows) == 5 and {row["metadata"]["nemogym_env"] for row in rows} == {"blackjack"}
    assert rows[0]["metadata"]["agent_ref"]["name"] == "blackjack_gymnasium_agent"  # the agent's /run gets it
    unnamed = invoke("convert", "--input", blackjack, "-o", tmp_path / "out2.jsonl")
    assert unnamed.exit_code != 0
    assert "'blackjack_gymnasium_agent'" in unnamed.output and "--env NAME" in unnamed.output
    assert "miles-nemogym serve --env NAME" in unnamed.output
