"""The scan's pure parts: input detection, selection, the results file, verdicts, statistics,
progress lines, and a golden scan called as a function."""

from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from miles_nemogym.data._select import InstanceIdsError, parse_instance_ids
from miles_nemogym.episode.run import RunResponse, classify_run_response
from miles_nemogym.scan._inputs import InputError, load_tasks, select
from miles_nemogym.scan._report import Counts, ScanProgress, render_summary
from miles_nemogym.scan._results import ResultLine, ResultsLock, ResultsWriter, Verdict, verdict_of
from miles_nemogym.scan._runner import EXIT_FAILED
from tests.support.environment_rows import shipped_rows
from tests.support.fault_server import FaultServer
from tests.support.golden_scan import golden_scan, not_passed, read_results
from tests.support.prompt_rows import converter_rows, write_jsonl

SKLEARN = "scikit-learn__scikit-learn-14141"


def result(instance_id: str, verdict: Verdict = Verdict.passed, seconds: float = 1.0) -> ResultLine:
    return ResultLine(
        instance_id=instance_id, verdict=verdict, reward=1.0 if verdict is Verdict.passed else 0.0, seconds=seconds
    )


def test_converter_and_raw_rows_are_detected_per_row(tmp_path: Path, gym_example_rows: list[dict[str, Any]]) -> None:
    raw = copy.deepcopy(gym_example_rows[0])
    raw["PASS_TO_PASS"] = json.dumps(raw["PASS_TO_PASS"])
    path = write_jsonl(tmp_path / "mixed.jsonl", [raw, *converter_rows(gym_example_rows[1:])])

    tasks = load_tasks(path)

    assert [task.instance_id for task in tasks] == [row["instance_id"] for row in gym_example_rows]
    assert tasks[0].metadata["PASS_TO_PASS"] == gym_example_rows[0]["PASS_TO_PASS"]
    assert tasks[1].metadata == gym_example_rows[1]  # the converter's metadata, as the agent gets it
    assert tasks[1].repo == gym_example_rows[1]["repo"]
    assert tasks[1].where == f"{path}:2"


def test_parquet_input_with_json_encoded_test_lists(tmp_path: Path, gym_example_rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {key: json.dumps(value) if key in ("FAIL_TO_PASS", "PASS_TO_PASS") else value for key, value in row.items()}
        for row in gym_example_rows
        for row in [{k: v for k, v in row.items() if k != "responses_create_params"}]
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test-00000-of-00001.parquet")

    tasks = load_tasks(tmp_path / "test-00000-of-00001.parquet")

    assert [task.metadata["FAIL_TO_PASS"] for task in tasks] == [row["FAIL_TO_PASS"] for row in gym_example_rows]


@pytest.mark.parametrize(
    ("mutate", "golden", "message"),
    [
        (lambda rows: [*rows, rows[0]], False, "repeats"),
        (lambda rows: [{**rows[0], "patch": ""}], True, "no gold 'patch'"),
        (lambda rows: [{**rows[0], "FAIL_TO_PASS": "[broken"}], False, "not a JSON list"),
        (lambda rows: [{"prompt": "x"}], False, "no 'instance_id'"),
        (lambda rows: [], False, "holds no task rows"),
    ],
)
def test_bad_rows_are_refused_with_their_line(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]], mutate: Any, golden: bool, message: str
) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", mutate(copy.deepcopy(gym_example_rows)))
    with pytest.raises(InputError, match=re.escape(message)):
        load_tasks(path, golden=golden)


def _converted(raw: dict[str, Any], environment: str, index: int) -> dict[str, Any]:
    metadata = {**raw, "nemogym_env": environment, "nemogym_task_id": f"{environment}/{index}"}
    return {"prompt": [], "metadata": metadata}


def test_environment_rows_are_read_as_convert_writes_them(tmp_path: Path) -> None:
    rows = [_converted(raw, "mcqa", index) for index, raw in enumerate(shipped_rows("mcqa")[:2])]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)

    tasks = load_tasks(path, golden=True)  # no 'patch', no 'subset': those are SWE rows' fields

    assert [(task.instance_id, task.environment, task.where) for task in tasks] == [
        ("mcqa/0", "mcqa", f"{path}:1"),
        ("mcqa/1", "mcqa", f"{path}:2"),
    ]
    assert tasks[0].metadata == rows[0]["metadata"]  # what the agent function gets
    assert "subset" not in tasks[0].metadata


def test_raw_environment_rows_are_refused_naming_convert(tmp_path: Path) -> None:
    raw = shipped_rows("mcqa")[0]
    for row in (raw, {**raw, "agent_ref": {"type": "responses_api_agents", "name": "mcqa_simple_agent"}}):
        path = write_jsonl(tmp_path / "rows.jsonl", [row])
        with pytest.raises(InputError) as refused:
            load_tasks(path)
        said = str(refused.value)
        assert said.startswith(f"{path}:1: a raw NeMo-Gym task row of environment "), said
        assert "miles-nemogym convert --env " in said and "then scan its output" in said


def test_a_file_mixing_swe_and_environment_rows_is_refused(
    tmp_path: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    mixed = [*converter_rows(gym_example_rows[:1]), _converted(shipped_rows("mcqa")[0], "mcqa", 0)]
    with pytest.raises(InputError, match=r":2: a mcqa environment row after SWE-bench rows \(.*:1\)"):
        load_tasks(write_jsonl(tmp_path / "rows.jsonl", mixed))
    two = [_converted(shipped_rows("mcqa")[0], "mcqa", 0), _converted(shipped_rows("mcqa")[0], "mcqa", 0)]
    with pytest.raises(InputError, match=r"task mcqa/0 repeats .*keyed by nemogym_task_id"):
        load_tasks(write_jsonl(tmp_path / "twice.jsonl", two))


def test_a_golden_scan_refuses_rows_without_a_known_gold(tmp_path: Path) -> None:
    from miles_nemogym.scan._runner import gold_answers

    mcqa = load_tasks(write_jsonl(tmp_path / "mcqa.jsonl", [_converted(shipped_rows("mcqa")[0], "mcqa", 0)]))
    known = gold_answers(mcqa)
    assert set(known["mcqa/0"]) == {"gold", "wrong"}
    game = load_tasks(write_jsonl(tmp_path / "bj.jsonl", [_converted(shipped_rows("blackjack")[0], "blackjack", 0)]))
    with pytest.raises(InputError, match=r"no gold answer known for blackjack's rows.*--policy-base-url") as refused:
        gold_answers(game)
    assert all(name in str(refused.value) for name in ("mcqa", "xlam_fc", "arc_agi", "calendar"))  # every rule named
    own = load_tasks(write_jsonl(tmp_path / "own.jsonl", [_converted(shipped_rows("mcqa")[0], "my_quiz", 0)]))
    with pytest.raises(InputError, match=r"my_quiz.*scan your own environment with --policy-base-url"):
        gold_answers(own)


def _outcome(reward: float, *, masked: bool = False, environment: str = "mcqa") -> Any:
    from miles_nemogym.episode.record import EpisodeRecord, Outcome, failure

    if masked:
        outcome = failure("seed_failed", "/seed_session answered 500")
    else:
        outcome = Outcome(reward=reward, eval_report={}, record=EpisodeRecord(status="ok", server_reward=reward))
    outcome.record.environment = environment
    return outcome


def test_a_golden_environment_row_passes_when_its_gold_passes_and_its_wrong_answer_does_not() -> None:
    from miles_nemogym.scan._results import golden_pair

    assert golden_pair(_outcome(1.0), _outcome(0.0)) == (Verdict.passed, "-", None)
    verdict, kind, reason = golden_pair(_outcome(0.0), _outcome(0.0))
    assert (verdict, kind) == (Verdict.failed, "failed")
    assert reason == "the row's gold answer did not pass: mcqa's verifier scored 0.0"  # store.views.reward_text
    assert golden_pair(_outcome(2 / 3), _outcome(0.0))[2] == (
        "the row's gold answer did not pass: mcqa's verifier scored 0.6667"
    )
    verdict, kind, reason = golden_pair(_outcome(1.0), _outcome(1.0))
    assert (verdict, kind) == (Verdict.failed, "wrong_answer_passed")
    assert reason is not None and reason.startswith("a wrong answer scored 1.0: ")
    verdict, kind, reason = golden_pair(_outcome(1.0), _outcome(0.0, masked=True))
    assert (verdict, kind) == (Verdict.infra, "seed_failed")
    assert reason is not None and reason.startswith("the wrong answer's episode: seed_failed: ")
    assert golden_pair(_outcome(0.0, masked=True), _outcome(1.0))[:2] == (Verdict.infra, "seed_failed")


def test_instance_ids_from_a_file_or_a_list_then_limit(tmp_path: Path, gym_example_rows: list[dict[str, Any]]) -> None:
    tasks = load_tasks(write_jsonl(tmp_path / "rows.jsonl", gym_example_rows))
    ids = [task.instance_id for task in tasks]
    listing = tmp_path / "ids.txt"
    listing.write_text(f"# wanted\n{ids[3]}\n\n{ids[1]}  # a comment\n{ids[4]}\n")

    assert parse_instance_ids(str(listing)) == [ids[3], ids[1], ids[4]]
    assert parse_instance_ids(f"{ids[0]}, {ids[2]}") == [ids[0], ids[2]]
    chosen = select(tasks, parse_instance_ids(str(listing)), limit=2)
    assert [task.instance_id for task in chosen] == [ids[1], ids[3]]  # input order, then the limit
    with pytest.raises(InputError, match="nope"):
        select(tasks, ["nope"], None)
    with pytest.raises(InstanceIdsError, match=r"^--instance-ids ' , ': no instance ids given$"):
        parse_instance_ids(" , ")


def test_results_file_survives_a_torn_last_line_and_refuses_a_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    lock = ResultsLock(path)
    writer = ResultsWriter(lock)
    writer.write(result("a"))
    writer.write(result("b", Verdict.infra))
    lock.release()
    assert set(read_results(path)) == {"a", "b"}
    assert path.read_text().count("\n") == 2  # each line is complete on disk when write() returns

    path.write_text(path.read_text() + '{"instance_id": "c", "verd')
    assert set(read_results(path)) == {"a", "b"}
    lock = ResultsLock(path)
    writer = ResultsWriter(lock)
    writer.write(result("d"))
    lock.release()
    assert set(read_results(path)) == {"a", "b", "d"}
    assert all(json.loads(line) for line in path.read_text().splitlines())

    (tmp_path / "foreign.jsonl").write_text('{"x": 1}\n{"instance_id": "a"}\n')
    with pytest.raises(InputError, match=r"foreign\.jsonl:1"):
        read_results(tmp_path / "foreign.jsonl")


def test_a_whole_last_result_without_its_newline_is_kept_not_cut(tmp_path: Path) -> None:
    """``read`` counts it as finished (``--resume`` skips it), so the writer must keep it: cutting
    it would lose a paid result from the file and the next resume would run it again."""
    path = tmp_path / "results.jsonl"
    lines = [json.dumps(result(name).model_dump(mode="json")) for name in "ab"]
    path.write_text(lines[0] + "\n" + lines[1])
    lock = ResultsLock(path)
    assert set(lock.read()) == {"a", "b"}
    ResultsWriter(lock).write(result("c"))
    lock.release()
    assert set(read_results(path)) == {"a", "b", "c"}
    assert path.read_text().splitlines()[:2] == lines


def test_p95_is_a_time_some_episode_took() -> None:
    counts = Counts()
    for seconds in range(1, 21):
        counts.add(result(f"i{seconds}", seconds=float(seconds)))
    assert counts.p95_s == 19.0
    assert counts.mean_s == 10.5
    one = Counts()
    one.add(result("x", seconds=7.0))
    assert one.p95_s == 7.0
    assert Counts().p95_s is None


def test_verdicts_and_reasons_follow_the_agents_classification(gym_example_rollouts: list[dict[str, Any]]) -> None:
    by_id = {row["instance_id"]: row for row in gym_example_rollouts}
    passed = classify_run_response(RunResponse.model_validate(by_id[SKLEARN]))
    assert verdict_of(passed)[0] is Verdict.passed and verdict_of(passed)[2] is None

    unapplied = copy.deepcopy(by_id[SKLEARN])
    unapplied["reward"] = 0.0
    unapplied["metadata"]["eval_report"][SKLEARN].update(patch_successfully_applied=False, resolved=False)
    outcome = classify_run_response(RunResponse.model_validate(unapplied))
    assert verdict_of(outcome)[0] is Verdict.failed
    assert verdict_of(outcome)[2] == "the patch did not apply (patch_successfully_applied=false)"

    pylint = classify_run_response(RunResponse.model_validate(by_id["pylint-dev__pylint-4551"]))
    pylint_reason = verdict_of(pylint)[2] or ""
    assert "FAIL_TO_PASS 10/10 failing" in pylint_reason
    assert "(+7 more)" in pylint_reason

    crashed = copy.deepcopy(by_id[SKLEARN])
    crashed.update(
        reward=0.0,
        metadata={
            # The real server's shape when the eval script cannot be built offline (Ray-wrapped).
            "error": '\x1b[36mray::runner_ray_remote()\x1b[39m (pid=1, ip=127.0.0.1)\n  File "x.py", line 3\n'
            "requests.exceptions.ConnectionError: Failed to resolve 'raw.githubusercontent.com'\n",
            "traceback": "Traceback ...",
        },
    )
    outcome = classify_run_response(RunResponse.model_validate(crashed))
    assert verdict_of(outcome)[0] is Verdict.infra
    assert verdict_of(outcome)[2] == (
        "agent_run_error: server error: requests.exceptions.ConnectionError: "
        "Failed to resolve 'raw.githubusercontent.com'"
    )

    masked = copy.deepcopy(by_id[SKLEARN])
    masked.update(mask_sample=True, failure_kind="provider_oom_killed", failure_reason="sandbox OOM")
    outcome = classify_run_response(RunResponse.model_validate(masked))
    assert verdict_of(outcome)[0] is Verdict.infra  # even with reward 1.0: not a measurement
    assert verdict_of(outcome)[2] == "provider_oom_killed: sandbox OOM"


def test_without_a_terminal_a_status_line_gives_done_counts_elapsed_and_eta() -> None:
    buffer = io.StringIO()
    progress = ScanProgress(Console(file=buffer, width=200), total=12, already_done=[result("old")])
    with progress:
        for number in range(9):
            progress.finished(result(f"i{number}", Verdict.failed if number == 4 else Verdict.passed))
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("[ 2/12] PASS  i0  reward 1.0  -  1.0s")
    assert "FAIL  i4  reward 0.0  unresolved" in lines[4]
    assert lines[-1].startswith("progress 10/12 done: 9 passed, 1 failed, 0 infra failures; elapsed 0:00:0")
    assert "ETA 0:00:0" in lines[-1]


def test_a_rows_rewards_read_as_every_view_shows_them() -> None:
    """store.views.reward_text, for the gold answer's reward and the wrong one's alike."""
    reason = "the row's gold answer did not pass: mcqa's verifier scored 0.9999"  # partial rewards never read whole
    partial = ResultLine(instance_id="mcqa/1", verdict=Verdict.failed, reward=0.99996, wrong_reward=0.00004,
                         failure_kind="failed", environment="mcqa", reason=reason)  # fmt: skip
    buffer = io.StringIO()
    console = Console(file=buffer, width=200)
    with ScanProgress(console, total=1, already_done=[]) as progress:
        progress.finished(partial)
    render_summary(console, [partial], selected=1, earlier=0, golden=True, interrupted=False)
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("[1/1] FAIL  mcqa/1  reward 0.9999 (wrong 0.0001)  failed  0.0s")
    assert f"  mcqa/1  reward 0.9999 (wrong 0.0001)  {reason}" in lines


def test_the_summary_shows_a_repo_name_as_written_never_as_markup() -> None:
    """A repo from the input rows is text: "[internal]" stays, "[/]" does not end the scan in a traceback."""
    results = [ResultLine(instance_id=f"i{n}", repo=repo, verdict=Verdict.passed, reward=1.0)
               for n, repo in enumerate(["acme/[internal]tools", "acme/[/]odd"])]  # fmt: skip
    buffer = io.StringIO()
    render_summary(Console(file=buffer, width=200), results, selected=2, earlier=0, golden=False, interrupted=False)
    assert "acme/[internal]tools" in buffer.getvalue() and "acme/[/]odd" in buffer.getvalue()


def test_on_a_terminal_the_live_bar_shows_the_counts() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=True, color_system=None)
    progress = ScanProgress(console, total=3, already_done=[])
    with progress:
        progress.finished(result("a"))
        progress.finished(result("b", Verdict.infra))
    text = buffer.getvalue()
    assert "2/3 done: 1 passed, 0 failed, 1 infra" in text  # never "2/3 passed ..."
    assert "/3 passed" not in text
    assert "ETA" in text


def test_golden_scan_function_names_the_four_real_rows_whose_tests_fail(
    gym_in_thread: FaultServer, tmp_path: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", gym_example_rows)
    buffer = io.StringIO()

    scanned = golden_scan(path, gym_in_thread.url, output_path=tmp_path / "out.jsonl", console=Console(file=buffer))

    assert scanned.exit_code == EXIT_FAILED
    assert len(scanned.results) == 5
    assert {item.instance_id for item in not_passed(scanned)} == {row["instance_id"] for row in gym_example_rows} - {
        SKLEARN
    }
    assert all(item.reason and "tests failing" in item.reason for item in not_passed(scanned))
    assert "overall" in buffer.getvalue()


def test_log_lines_written_during_a_scan_never_carry_the_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from miles_nemogym.scan import _install_logging

    secret = "sk-log-test-0123456789"
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", secret)
    buffer = io.StringIO()
    handler = _install_logging(Console(file=buffer))
    try:
        logging.getLogger("aiohttp.client").error("request to %s failed: key=%s", "http://x/v1", secret)
    finally:
        logging.getLogger().removeHandler(handler)
    assert "request to http://x/v1 failed: key=***" in buffer.getvalue()
    assert secret not in buffer.getvalue()


def test_an_api_policy_for_environment_rows_is_its_v1_url() -> None:
    from miles_nemogym.scan._runner import session_base

    assert session_base("https://api.example.com/openai/v1") == "https://api.example.com/openai"
    with pytest.raises(InputError, match=r"give the URL ending in /v1"):
        session_base("https://api.example.com/openai")
