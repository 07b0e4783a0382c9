"""``miles-nemogym scan`` end to end against a loopback server answering real ``/run`` results.

Each test drives the CLI (typer's CliRunner, in-process) against ``FaultServer`` and checks
what the user relies on: exit codes, the reasons a golden scan reports, infrastructure
failure counting, the results file and ``--resume``, the per-repo summary, secrets, and
that the scan sends exactly what the agent function sends.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym import agent, transport
from miles_nemogym.cli.main import app
from miles_nemogym.episode.run import build_run_body
from tests.support.fault_server import FaultServer, serving_in_thread
from tests.support.openapi import openapi_document
from tests.support.ports import free_port
from tests.support.prompt_rows import converter_rows, write_jsonl

SKLEARN = "scikit-learn__scikit-learn-14141"
DJANGO = "django__django-10973"
PYLINT = "pylint-dev__pylint-4551"
SPHINX = "sphinx-doc__sphinx-8595"
SYMPY = "sympy__sympy-20916"
SECRET = "sk-test-5f3c9a1e7b2d4c6f8a0b"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "NEMO_GYM_URL",
        "NEMO_GYM_POLICY_API_KEY",
        "NEMO_GYM_RUN_TIMEOUT",
        "NEMO_GYM_MAX_CONCURRENCY",
        "NEMO_GYM_TIMEOUT_REWARD",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def input_file(tmp_path: Path, gym_example_rows: list[dict[str, Any]]) -> Path:
    return write_jsonl(tmp_path / "verified.jsonl", converter_rows(gym_example_rows))


def scan(*args: str) -> Any:
    """``miles-nemogym scan``; without --golden or --policy-base-url, an API-policy scan whose
    policy is the server's own URL + /v1 (it answers, with a 404: enough for the scan's check)."""
    if "--golden" not in args and "--policy-base-url" not in args:
        gym_url = args[args.index("--gym-url") + 1] if "--gym-url" in args else ""
        args = (*args, "--policy-base-url", f"{gym_url if gym_url.startswith('http') else 'http://127.0.0.1:9'}/v1")
    return CliRunner().invoke(app, ["scan", *args], catch_exceptions=False)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_golden_scan_reports_each_non_passing_instance_with_its_reason(
    gym_in_thread: FaultServer, input_file: Path, tmp_path: Path, gym_example_rollouts: list[dict[str, Any]]
) -> None:
    out = tmp_path / "results.jsonl"
    result = scan("--input", str(input_file), "--golden", "--gym-url", gym_in_thread.url, "--output", str(out))

    assert result.exit_code == 1, result.output
    assert sorted(gym_in_thread.received_ids()) == sorted([SKLEARN, DJANGO, PYLINT, SPHINX, SYMPY])
    # The reasons come from the real SWE-bench reports the server returned.
    failing = {
        row["instance_id"]: row["metadata"]["eval_report"][row["instance_id"]]["tests_status"]["FAIL_TO_PASS"][
            "failure"
        ]
        for row in gym_example_rollouts
    }
    listed = result.output.split("not 1.0 (golden mode expects 1.0 everywhere):", 1)[1]
    for instance_id in (DJANGO, PYLINT, SPHINX, SYMPY):
        line = next(text for text in listed.splitlines() if instance_id in text)
        assert "tests failing: FAIL_TO_PASS" in line
        assert failing[instance_id][0] in line
    assert SKLEARN not in listed
    assert "PASS_TO_PASS 1/1 failing: test_requires_partial" in listed  # sympy's broken pass-to-pass test

    by_id = {row["instance_id"]: row for row in lines(out)}
    assert set(by_id) == {SKLEARN, DJANGO, PYLINT, SPHINX, SYMPY}
    assert by_id[SKLEARN]["verdict"] == "passed" and by_id[SKLEARN]["reward"] == 1.0
    assert by_id[SKLEARN]["reason"] is None
    assert {by_id[i]["verdict"] for i in (DJANGO, PYLINT, SPHINX, SYMPY)} == {"failed"}
    assert by_id[SPHINX]["nemogym"]["resolved"] is False
    assert by_id[SPHINX]["mode"] == "golden"


def test_golden_scan_names_a_patch_that_did_not_apply(
    gym_in_thread: FaultServer, input_file: Path, gym_example_rollouts: list[dict[str, Any]]
) -> None:
    report = gym_in_thread.results_by_instance[SKLEARN]["metadata"]["eval_report"][SKLEARN]
    report.update(patch_successfully_applied=False, resolved=False)
    gym_in_thread.results_by_instance[SKLEARN]["reward"] = 0.0

    result = scan("--input", str(input_file), "--golden", "--gym-url", gym_in_thread.url, "--instance-ids", SKLEARN)

    assert result.exit_code == 1
    assert "the patch did not apply (patch_successfully_applied=false)" in result.output


def test_exit_0_when_every_golden_instance_scores_1(gym_in_thread: FaultServer, input_file: Path) -> None:
    result = scan("--input", str(input_file), "--golden", "--gym-url", gym_in_thread.url, "--instance-ids", SKLEARN)

    assert result.exit_code == 0, result.output
    assert gym_in_thread.received_ids() == [SKLEARN]
    assert "not 1.0" not in result.output


def test_infra_failures_are_counted_apart_from_failed_instances(
    gym_in_thread: FaultServer, input_file: Path, tmp_path: Path
) -> None:
    gym_in_thread.modes = {DJANGO: "500", PYLINT: "error_metadata"}
    out = tmp_path / "results.jsonl"
    result = scan(
        "--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out), "--allow-unresolved"
    )  # fmt: skip

    # Unresolved instances are allowed here, infrastructure failures never are.
    assert result.exit_code == 1, result.output
    by_id = {row["instance_id"]: row for row in lines(out)}
    assert by_id[DJANGO]["verdict"] == "infra"
    assert by_id[DJANGO]["failure_kind"] == "agent_run_error"
    assert "HTTP 500" in by_id[DJANGO]["reason"]
    assert by_id[PYLINT]["verdict"] == "infra"
    assert "Failed to build eval script: no network" in by_id[PYLINT]["reason"]
    assert by_id[PYLINT]["eval_report"]["traceback"].startswith("Traceback")
    assert by_id[PYLINT]["nemogym"]["mask_sample"] is True
    overall = next(line for line in result.output.splitlines() if "overall" in line)
    assert [int(cell) for cell in overall.replace("│", " ").split()[1:5]] == [5, 1, 2, 2]
    assert "2 instances infrastructure failures" in result.output


def test_allow_unresolved_exits_0_when_every_episode_was_graded(gym_in_thread: FaultServer, input_file: Path) -> None:
    plain = scan("--input", str(input_file), "--gym-url", gym_in_thread.url)
    allowed = scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--allow-unresolved")

    assert plain.exit_code == 1
    assert allowed.exit_code == 0, allowed.output


def test_summary_has_one_row_per_repo_with_counts_and_times(
    gym_in_thread: FaultServer, input_file: Path, tmp_path: Path
) -> None:
    gym_in_thread.modes = {DJANGO: "500"}
    gym_in_thread.hold_s = 0.3  # every episode takes at least this long
    out = tmp_path / "results.jsonl"
    result = scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out))

    rows = {}
    for line in result.output.splitlines():
        cells = line.replace("│", " ").split()
        if len(cells) == 7 and cells[1].isdigit():
            rows[cells[0]] = cells[1:]
    assert rows["django/django"][:4] == ["1", "0", "0", "1"]
    assert rows["scikit-learn/scikit-learn"][:4] == ["1", "1", "0", "0"]
    assert rows["sympy/sympy"][:4] == ["1", "0", "1", "0"]
    assert rows["overall"][:4] == ["5", "1", "3", "1"]
    kinds = next(line for line in result.output.splitlines() if line.startswith("not passed, by kind: "))
    assert kinds == "not passed, by kind: unresolved 3, agent_run_error 1"
    # The times are each repo's episodes' own: mean and nearest-rank p95 of the results' seconds.
    seconds: dict[str, list[float]] = {"overall": []}
    for line in lines(out):
        seconds.setdefault(line["repo"], []).append(line["seconds"])
        seconds["overall"].append(line["seconds"])
    assert set(seconds) == set(rows) and min(seconds["overall"]) >= 0.3
    for repo, taken in seconds.items():
        ordered = sorted(taken)
        p95 = ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)]
        assert rows[repo][4:] == [f"{sum(taken) / len(taken):.1f}", f"{p95:.1f}"], repo  # mean s, p95 s


def test_resume_skips_finished_instances_and_summarises_the_whole_selection(
    gym_in_thread: FaultServer, input_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "results.jsonl"
    first = scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out), "--limit", "2")
    assert first.exit_code == 1
    done_first = [row["instance_id"] for row in lines(out)]
    assert len(done_first) == 2

    again = scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out))
    assert again.exit_code == 2, "an existing results file is never appended to without --resume"
    assert "--resume" in again.output

    resumed = scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out), "--resume")
    received = gym_in_thread.received_ids()
    assert len(received) == 5  # 2 + 3: no instance ran twice
    assert sorted(received[2:]) == sorted(set(received) - set(done_first))
    assert sorted(row["instance_id"] for row in lines(out)) == sorted(received)
    assert "2 results from an earlier run" in resumed.output
    overall = next(line for line in resumed.output.splitlines() if "overall" in line)
    assert overall.replace("│", " ").split()[1] == "5"

    other_mode = scan(
        "--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out), "--resume", "--golden"
    )
    assert other_mode.exit_code == 2
    assert "holds policy results and this is a golden scan" in other_mode.output

    nothing_left = scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out), "--resume")
    assert len(gym_in_thread.received_ids()) == 5
    assert nothing_left.exit_code == 1  # the verdict on the whole selection is unchanged


def test_resume_runs_again_an_instance_whose_line_was_torn_by_a_crash(
    gym_in_thread: FaultServer, input_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "results.jsonl"
    scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out), "--limit", "2")
    text = out.read_text()
    torn_id = json.loads(text.splitlines()[1])["instance_id"]
    out.write_text(text[: len(text) - 40])  # the second line cut mid-write

    scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out), "--resume", "--limit", "2")

    assert gym_in_thread.received_ids().count(torn_id) == 2
    assert [row["instance_id"] for row in lines(out)][-1] == torn_id


@pytest.mark.parametrize(
    ("problem", "expected"),
    [
        ("unreachable", "openapi.json: connection refused (nothing listens on that port); start the server"),
        ("not_a_gym", "does not offer POST /run"),
        ("bad_json", "verified.jsonl:6: not valid JSON: Expecting property name enclosed in double quotes"),
        ("missing_input", "no such input file"),
        ("golden_and_policy", "--golden with --policy-base-url"),
        ("unknown_id", "not in the input file: nope__nope-1"),
        ("bad_row", "instance_id must be a non-empty string"),
        ("bad_results_file", "not a scan result line"),
        ("bad_gym_url", "--gym-url"),
        ("bad_row_params", "verified.jsonl:6: instance nope__bad-1: "),
        ("bad_sampling", "the sampling flags cannot be sent: request_kwargs['temperature'] must be finite, got nan"),
    ],
)
def test_exit_2_before_any_episode_when_the_scan_cannot_start(
    problem: str,
    expected: str,
    input_file: Path,
    tmp_path: Path,
    gym_in_thread: FaultServer,
) -> None:
    gym = gym_in_thread
    if problem == "not_a_gym":
        gym.openapi = openapi_document(with_run=False)
    url = f"http://127.0.0.1:{free_port()}" if problem == "unreachable" else gym.url
    args = ["--input", str(input_file), "--gym-url", url, "--output", str(tmp_path / "out.jsonl")]
    if problem == "bad_json":
        input_file.write_text(input_file.read_text() + "{not json\n")
    if problem == "missing_input":
        args[1] = str(tmp_path / "missing.jsonl")
    if problem == "golden_and_policy":
        args += ["--golden", "--policy-base-url", "http://127.0.0.1:9/v1"]
    if problem == "unknown_id":
        args += ["--instance-ids", f"{SKLEARN},nope__nope-1"]
    if problem == "bad_row":
        input_file.write_text(
            input_file.read_text() + json.dumps({"prompt": "x", "metadata": {"instance_id": 7}}) + "\n"
        )
    if problem == "bad_results_file":
        (tmp_path / "out.jsonl").write_text("instance,reward\nfoo,1\n")
        args += ["--resume"]
    if problem == "bad_gym_url":
        args[3] = "ftp://127.0.0.1:1"
    if problem == "bad_sampling":
        args += ["--temperature", "nan"]
    if problem == "bad_row_params":  # a row whose /run body cannot be built
        row = {**json.loads(input_file.read_text().splitlines()[0])}
        row["metadata"] = {**row["metadata"], "instance_id": "nope__bad-1"}
        row["metadata"]["responses_create_params"] = {"input": [], "top_k": 5}
        input_file.write_text(input_file.read_text() + json.dumps(row) + "\n")

    result = scan(*args)

    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert gym.received_ids() == []
    if problem != "bad_results_file":
        assert not (tmp_path / "out.jsonl").exists()  # a scan that could not start leaves no file


def test_a_scan_naming_no_model_refuses_at_once_with_the_two_ways_to_run_it(
    gym_in_thread: FaultServer, input_file: Path
) -> None:
    started = time.monotonic()
    result = CliRunner().invoke(app, ["scan", "--input", str(input_file), "--gym-url", gym_in_thread.url])

    assert result.exit_code == 2, result.output
    assert time.monotonic() - started < 5
    assert "--golden (a server started with `miles-nemogym serve --golden`" in " ".join(result.output.split())
    assert "--policy-base-url URL" in result.output
    assert gym_in_thread.received_ids() == []


def test_a_policy_that_does_not_answer_stops_the_scan_before_any_episode(
    gym_in_thread: FaultServer, input_file: Path
) -> None:
    policy = f"http://127.0.0.1:{free_port()}/v1"
    result = scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--policy-base-url", policy)

    assert result.exit_code == 2, result.output
    assert f"the policy endpoint does not answer: GET {policy}/models: connection refused" in " ".join(
        result.output.split()
    )
    assert gym_in_thread.received_ids() == []


def test_policy_scan_refuses_a_server_that_would_ignore_policy_base_url(
    tmp_path: Path, input_file: Path, gym_in_thread: FaultServer
) -> None:
    gym = gym_in_thread
    gym.openapi = openapi_document(with_policy_field=False)
    policy = scan("--input", str(input_file), "--gym-url", gym.url, "--policy-base-url", "http://10.0.0.5:8000/v1")
    assert policy.exit_code == 2
    assert "declares no policy_base_url" in policy.output
    assert gym.received_ids() == []
    # A golden scan never sends policy_base_url, so the same server is fine for it.
    golden = scan("--input", str(input_file), "--gym-url", gym.url, "--golden", "--instance-ids", SKLEARN)
    assert golden.exit_code == 0, golden.output


def test_raw_rows_need_a_subset_and_are_sent_like_converted_rows(
    gym_in_thread: FaultServer, tmp_path: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    raw = []
    for row in gym_example_rows:
        plain = {key: value for key, value in row.items() if key not in ("subset", "split", "responses_create_params")}
        # The HF parquet's shape: test lists as JSON strings.
        plain["FAIL_TO_PASS"] = json.dumps(row["FAIL_TO_PASS"])
        plain["PASS_TO_PASS"] = json.dumps(row["PASS_TO_PASS"])
        raw.append(plain)
    raw_file = write_jsonl(tmp_path / "raw.jsonl", raw)

    refused = scan("--input", str(raw_file), "--gym-url", gym_in_thread.url)
    assert refused.exit_code == 2
    assert "--subset verified" in refused.output
    assert gym_in_thread.received_ids() == []

    mixed = write_jsonl(tmp_path / "mixed.jsonl", raw[:2] + converter_rows(gym_example_rows[2:]))
    result = scan("--input", str(mixed), "--gym-url", gym_in_thread.url, "--subset", "verified", "--allow-unresolved")
    assert result.exit_code == 0, result.output
    bodies = {body["instance_id"]: body for body in gym_in_thread.bodies}
    for row in gym_example_rows[:2]:
        body = bodies[row["instance_id"]]
        assert body["FAIL_TO_PASS"] == row["FAIL_TO_PASS"] and isinstance(body["FAIL_TO_PASS"], list)
        assert body["subset"] == "verified" and body["split"] == "test"
    for row in gym_example_rows[2:]:
        assert bodies[row["instance_id"]]["subset"] == row["subset"]


async def test_scan_sends_exactly_what_the_agent_function_sends(
    gym_in_thread: FaultServer,
    input_file: Path,
    gym_example_rows: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    monkeypatch.setenv("NEMO_GYM_URL", gym_in_thread.url)
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", SECRET)
    session = "http://10.1.2.3:30000/sessions/abc"
    row = next(row for row in gym_example_rows if row["instance_id"] == SYMPY)
    request_kwargs = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 512}
    await agent.run(base_url=session, prompt=None, request_kwargs=request_kwargs, metadata=row)
    await transport.close_pools()
    agent_body = gym_in_thread.bodies[-1]

    def run_cli() -> Any:
        return scan(
            "--input", str(input_file), "--instance-ids", SYMPY, "--policy-base-url", f"{session}/v1",
            "--temperature", "0.7", "--top-p", "0.9", "--max-tokens", "512",
        )  # fmt: skip

    await asyncio.to_thread(run_cli)
    scan_body = gym_in_thread.bodies[-1]

    assert scan_body == agent_body
    assert scan_body == build_run_body(row, request_kwargs, policy_base_url=f"{session}/v1", policy_api_key=SECRET)
    params = scan_body["responses_create_params"]
    assert (params["temperature"], params["top_p"], params["max_output_tokens"]) == (0.7, 0.9, 512)


def test_api_key_reaches_the_server_but_never_the_output(
    gym_in_thread: FaultServer, input_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", SECRET)
    gym_in_thread.modes = {DJANGO: "echo_key_error", PYLINT: "echo_key_error"}
    out = tmp_path / "results.jsonl"
    result = scan(
        "--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out),
        "--policy-base-url", f"{gym_in_thread.url}/v1",
    )  # fmt: skip

    assert result.exit_code == 1
    assert {body.get("policy_api_key") for body in gym_in_thread.bodies} == {SECRET}
    assert {body.get("policy_base_url") for body in gym_in_thread.bodies} == {f"{gym_in_thread.url}/v1"}
    text = out.read_text()
    assert "auth failed for ***" in text  # the echoed key was there, and was redacted
    assert SECRET not in text
    assert SECRET not in result.stdout
    assert SECRET not in result.stderr
    assert "auth failed for ***" in result.output


def test_api_key_is_not_sent_to_the_servers_own_model(
    gym_in_thread: FaultServer, input_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", SECRET)
    result = scan("--input", str(input_file), "--golden", "--gym-url", gym_in_thread.url, "--instance-ids", SKLEARN)

    assert result.exit_code == 0
    assert "policy_api_key" not in gym_in_thread.bodies[0]
    # Only the scan's own check endpoint, which a golden server never calls.
    assert gym_in_thread.bodies[0]["policy_base_url"].startswith("http://127.0.0.1:")


def test_golden_scan_refuses_at_once_a_server_started_without_golden(
    gym_example_rollouts: list[dict[str, Any]], input_file: Path
) -> None:
    # A server without --golden plays the task with a model, and holds the /run meanwhile.
    not_golden = FaultServer.of_results(gym_example_rollouts, mode="hold", policy_calls=1)
    with serving_in_thread(not_golden) as server:
        started = time.monotonic()
        result = scan("--input", str(input_file), "--golden", "--gym-url", server.url, "--concurrency", "1")
        seconds = time.monotonic() - started
    said = " ".join(result.output.split())
    assert result.exit_code == 2, said
    assert f"{server.url}/run is not a golden server: its /run called a model" in said
    assert "restart it with `miles-nemogym serve --golden`" in said
    assert seconds < 30 and len(server.received_ids()) == 1


def test_timeout_and_concurrency_flags_override_the_environment(
    gym_in_thread: FaultServer, input_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_GYM_RUN_TIMEOUT", "3600")
    gym_in_thread.modes = {SYMPY: "hold"}  # never released: only the scan's --timeout ends it
    out = tmp_path / "results.jsonl"
    result = scan(
        "--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out), "--timeout", "1",
        "--instance-ids", f"{SYMPY},{SKLEARN}", "--concurrency", "1",
    )  # fmt: skip

    assert result.exit_code == 1
    by_id = {row["instance_id"]: row for row in lines(out)}
    # A scan has no Miles session to ask whether the policy was called: the timeout is set aside.
    assert by_id[SYMPY]["verdict"] == "infra"
    assert by_id[SYMPY]["failure_kind"] == "agent_timeout"
    assert "1s" in by_id[SYMPY]["reason"]
    assert by_id[SKLEARN]["verdict"] == "passed"


def test_a_results_file_from_another_input_is_refused(
    gym_in_thread: FaultServer, input_file: Path, tmp_path: Path, gym_example_rows: list[dict[str, Any]]
) -> None:
    out = tmp_path / "results.jsonl"
    first = scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out), "--limit", "2")
    assert first.exit_code == 1
    done = sorted(row["instance_id"] for row in lines(out))
    before = out.read_text()

    others = [dict(row, instance_id=f"other__repo-{number}") for number, row in enumerate(gym_example_rows)]
    other_input = write_jsonl(tmp_path / "other.jsonl", converter_rows(others))
    other = scan("--input", str(other_input), "--gym-url", gym_in_thread.url, "--output", str(out), "--resume")
    assert other.exit_code == 2
    assert (
        f"--output {out} holds results for 2 instances that --input {other_input} does not hold "
        f"(e.g. {', '.join(done)}): it is another input's results file"
    ) in " ".join(other.output.split())

    edited = [dict(row, problem_statement=row["problem_statement"] + " (edited)") for row in gym_example_rows]
    edited_input = write_jsonl(tmp_path / "edited.jsonl", converter_rows(edited))
    changed = scan("--input", str(edited_input), "--gym-url", gym_in_thread.url, "--output", str(out), "--resume")
    assert changed.exit_code == 2
    assert "2 instances whose task rows differ from --input's" in " ".join(changed.output.split())

    assert len(gym_in_thread.received_ids()) == 2  # neither refused scan sent anything
    assert out.read_text() == before


def test_output_in_a_folder_that_cannot_be_written_exits_2(
    gym_in_thread: FaultServer, input_file: Path, tmp_path: Path
) -> None:
    if os.geteuid() == 0:  # root writes through file modes; sysfs refuses new files to everyone
        folder = Path("/sys")
    else:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
    out = folder / "results.jsonl"
    result = scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(out))
    assert result.exit_code == 2
    message = " ".join(result.output.split())
    assert f"--output {out}: cannot create or open the results file (Permission denied)" in message
    assert gym_in_thread.received_ids() == []
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    under_a_file = scan(
        "--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(blocker / "r.jsonl")
    )
    assert under_a_file.exit_code == 2
    assert "cannot create or open the results file" in under_a_file.output


def test_output_through_a_planted_link_is_refused_and_its_target_untouched(
    gym_in_thread: FaultServer, input_file: Path, tmp_path: Path
) -> None:
    one_line, empty, dangling = tmp_path / "one-line.txt", tmp_path / "empty.txt", tmp_path / "absent.txt"
    one_line.write_text("keep me\n")
    empty.write_text("")
    for number, target in enumerate((one_line, empty, dangling)):
        link = tmp_path / f"results-{number}.jsonl"
        link.symlink_to(target)
        result = scan("--input", str(input_file), "--gym-url", gym_in_thread.url, "--output", str(link))
        assert result.exit_code == 2, result.output
        assert f"--output {link}: is a symbolic link" in " ".join(result.output.split())
        assert link.is_symlink()
    assert one_line.read_text() == "keep me\n"
    assert empty.read_text() == ""
    assert not dangling.exists()
    assert gym_in_thread.received_ids() == []


def test_a_bad_gym_url_with_a_password_is_quoted_with_the_password_hidden(
    input_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", "http://user:s3cret-pass@gym:12000/run")
    result = scan("--input", str(input_file))
    assert result.exit_code == 2
    assert "s3cret-pass" not in result.output
    assert "http://user:***@gym:12000/run" in " ".join(result.output.split())
