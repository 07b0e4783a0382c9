"""The plugin against the real NeMo-Gym server: agent, filter, abort, scan, doctor, smoke.

Every test here runs the real ``mini_swe_agent_2`` server (nemo-gym 0.7.0, local sandbox)
on the five real SWE-bench Verified rows from its wheel, converted by our converter. The
policy is the recording policy at Miles' session URL shape; the agent function is called
directly with the arguments Miles passes (Miles' own rollout around the same hooks is
tested in ``test_miles_rollout.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym import agent, groups, transport
from miles_nemogym.checks import all_passed
from miles_nemogym.cli._doctor import run_checks
from miles_nemogym.cli.main import app
from miles_nemogym.data import convert_row
from miles_nemogym.gym.config import ServeOptions
from miles_nemogym.gym.server import GymServer, free_port
from miles_nemogym.smoke._policy import RecordingPolicy
from miles_nemogym.store import _reader as reader
from tests.integration.conftest import INTEGRATION_OPTIONS
from tests.support.eventually import eventually
from tests.support.golden_scan import golden_scan, not_passed
from tests.support.held_policy import HeldPolicy
from tests.support.samples import Sample

pytestmark = pytest.mark.integration

GRADED_OFFLINE = ("sympy__sympy-20916", "sphinx-doc__sphinx-8595", "scikit-learn__scikit-learn-14141")
DJANGO = "django__django-10973"
# Miles' rollout sampling params as agentic_tool_call hands them to the agent function
# (renamed to chat-completion names; checked against Miles in test_miles_rollout.py).
REQUEST_KWARGS = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 512, "top_k": 20, "seed": 7}


@pytest.fixture(scope="module")
def prompt_rows(gym_example_rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The wheel's rows as our converter writes them for Miles' --prompt-data."""
    return {row["instance_id"]: convert_row(row) for row in gym_example_rows}


@pytest.fixture
def gym_env(gym_server: GymServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[GymServer]:
    monkeypatch.setenv("NEMO_GYM_URL", gym_server.url)
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", "sk-e2e-secret")
    monkeypatch.setenv("NEMO_GYM_RUN_TIMEOUT", "600")
    yield gym_server


async def run_sample(row: dict[str, Any], session_url: str) -> Sample:
    """One episode through the agent function; its dict merged into the row's metadata (v1)."""
    metadata = dict(row["metadata"])
    out = await agent.run(base_url=session_url, prompt=row["prompt"], request_kwargs=REQUEST_KWARGS, metadata=metadata)
    return Sample(prompt=row["prompt"], metadata={**metadata, **out})


async def first_policy_call(policy: HeldPolicy, session: str, timeout_s: float = 120) -> None:
    """Wait until the real episode has called the policy on ``session`` (held or answered)."""
    await eventually(lambda: policy.arrivals(session), "the episode called the policy", timeout_s)


async def test_three_real_episodes_at_once_each_on_its_own_session(
    gym_env: GymServer, recording_policy: HeldPolicy, prompt_rows: dict[str, dict[str, Any]]
) -> None:
    urls = {iid: recording_policy.session_url() for iid in GRADED_OFFLINE}
    try:
        samples = await asyncio.gather(*(run_sample(prompt_rows[iid], urls[iid]) for iid in GRADED_OFFLINE))
    finally:
        await transport.close_pools()

    for iid, sample in zip(GRADED_OFFLINE, samples, strict=True):
        session = RecordingPolicy.session_id_of(urls[iid])
        chats = recording_policy.chat_requests(session)
        assert len(chats) >= 2, f"{iid}: {len(chats)} chat requests"
        for request in chats:
            assert request.path == f"/sessions/{session}/v1/chat/completions"
            assert request.authorization == "Bearer sk-e2e-secret"
            body = request.body
            assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.7, 0.9, 512)
            assert (body["top_k"], body["seed"]) == (20, 7)
        record = sample.metadata["nemogym"]
        assert record["status"] == "ok" and record["mask_sample"] is False, record
        assert record["instance_id"] == iid and record["attempts"] == 1
        assert record["patch_applied"] is not None
        assert record["fail_to_pass"] is not None and record["pass_to_pass"] is not None
        assert record["turns"] >= 2 and record["tool_calls"] >= 2
        assert sample.metadata["reward"] == 0.0  # no task container: graded, not resolved
        assert iid in sample.metadata["eval_report"]["eval_report"]
        assert "sk-e2e-secret" not in json.dumps(sample.metadata)
    # No request reached another session's path.
    assert {r.session_id for r in recording_policy.requests()} == {
        RecordingPolicy.session_id_of(u) for u in urls.values()
    }
    assert groups.check_episode_group(None, list(samples)).keep


async def test_a_crashed_episode_is_set_aside_and_a_group_of_two_left_with_one_valid_is_dropped(
    gym_env: GymServer, recording_policy: HeldPolicy, prompt_rows: dict[str, dict[str, Any]]
) -> None:
    try:
        sample = await run_sample(prompt_rows[DJANGO], recording_policy.session_url())
    finally:
        await transport.close_pools()
    record = sample.metadata["nemogym"]
    assert record["status"] == "failed" and record["mask_sample"] is True
    assert record["failure_kind"] == "agent_run_error"
    assert record["failure_reason"].startswith("server error: ")
    assert "error" in sample.metadata["eval_report"]
    assert sample.metadata["reward"] == 0.0
    ok = Sample(metadata={"nemogym": {"status": "ok", "mask_sample": False}, "reward": 1.0})
    verdict = groups.check_episode_group(None, [ok, sample])
    assert (verdict.keep, verdict.reason) == (False, "nemogym_agent_run_error")


async def test_abort_returns_promptly_while_a_real_episode_waits_on_the_policy(
    gym_env: GymServer, recording_policy: HeldPolicy, prompt_rows: dict[str, dict[str, Any]]
) -> None:
    url = recording_policy.session_url()
    session = RecordingPolicy.session_id_of(url)
    recording_policy.hold_session(session)
    task = asyncio.create_task(run_sample(prompt_rows[GRADED_OFFLINE[0]], url))
    try:
        await first_policy_call(recording_policy, session)
        started = time.monotonic()
        await agent.abort(None)
        sample = await asyncio.wait_for(task, 5)
        assert time.monotonic() - started < 5
    finally:
        recording_policy.release()
        await transport.close_pools()
    assert sample.metadata["nemogym"]["failure_kind"] == "cancelled"
    assert sample.metadata["nemogym"]["mask_sample"] is True


async def test_server_killed_mid_episode_is_a_transport_failure_never_resent(
    prompt_rows: dict[str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        HeldPolicy(look_around_turns=2) as policy,
        GymServer(ServeOptions.model_validate(INTEGRATION_OPTIONS), state_dir=tmp_path / "gym") as server,
    ):
        monkeypatch.setenv("NEMO_GYM_URL", server.url)
        url = policy.session_url()
        session = RecordingPolicy.session_id_of(url)
        policy.hold_session(session)
        task = asyncio.create_task(run_sample(prompt_rows[GRADED_OFFLINE[0]], url))
        try:
            await first_policy_call(policy, session)
            assert server.pid is not None
            os.killpg(server.pid, signal.SIGKILL)
            sample = await asyncio.wait_for(task, 30)
        finally:
            policy.release()
            await transport.close_pools()
    record = sample.metadata["nemogym"]
    assert record["failure_kind"] == "transport_peer_drop", record
    assert record["mask_sample"] is True and record["attempts"] == 1
    assert len(policy.chat_requests(session)) == 1  # one episode, never a second


def test_golden_scan_names_each_grading_failure(
    gym_golden_server: GymServer, gym_example_rows: list[dict[str, Any]], tmp_path: Path
) -> None:
    rows = tmp_path / "verified.jsonl"
    rows.write_text("".join(json.dumps(convert_row(r)) + "\n" for r in gym_example_rows))
    result = golden_scan(rows, gym_golden_server.url, output_path=tmp_path / "golden.jsonl", concurrency=4)
    assert result.exit_code == 1
    assert {r.instance_id for r in not_passed(result)} == {r["instance_id"] for r in gym_example_rows}
    by_id = {r.instance_id: r for r in not_passed(result)}
    for iid in GRADED_OFFLINE:  # graded on the host: the gold patch applies, the tests cannot pass
        assert by_id[iid].verdict.value == "failed", by_id[iid]
        assert by_id[iid].reason
    assert by_id[DJANGO].verdict.value == "infra"
    assert "server error" in (by_id[DJANGO].reason or "")
    lines = (tmp_path / "golden.jsonl").read_text().splitlines()
    assert len(lines) == len(gym_example_rows)


def test_golden_scan_refuses_a_server_serve_started_without_golden_before_any_episode(
    gym_server: GymServer, gym_example_rows: list[dict[str, Any]], tmp_path: Path
) -> None:
    rows = tmp_path / "verified.jsonl"
    rows.write_text("".join(json.dumps(convert_row(r)) + "\n" for r in gym_example_rows[:1]))
    out = tmp_path / "golden.jsonl"
    cli = CliRunner().invoke(
        app, ["scan", "--input", str(rows), "--golden", "--gym-url", gym_server.url, "--output", str(out)]
    )
    said = " ".join(cli.output.split())
    assert cli.exit_code == 2, said
    assert "serve started it without --golden (it answers as mini_swe_agent_2_policy" in said
    assert not out.exists() or out.read_text() == ""  # refused before the first episode


def test_doctor_passes_against_the_real_server_and_names_a_wrong_port(
    gym_server: GymServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", gym_server.url)
    assert all_passed(run_checks(session_host="127.0.0.1"))
    cli = CliRunner().invoke(app, ["doctor", "--session-host", "127.0.0.1"])
    assert cli.exit_code == 0, cli.output

    monkeypatch.setenv("NEMO_GYM_URL", f"http://127.0.0.1:{free_port()}")
    results = run_checks(session_host="127.0.0.1")
    assert not all_passed(results)
    failed = [r for r in results if r.status.value == "fail"]
    assert failed and "NEMO_GYM_URL" in (failed[0].detail + " " + failed[0].fix)
    cli = CliRunner().invoke(app, ["doctor"])
    assert cli.exit_code == 1


def test_smoke_runs_the_whole_chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEMO_GYM_EPISODE_DIR", raising=False)
    store = tmp_path / "episodes"
    result = CliRunner().invoke(app, ["smoke", "--state-dir", str(tmp_path / "smoke"), "--episode-dir", str(store)])
    assert result.exit_code == 0, result.output
    for iid in GRADED_OFFLINE:
        assert iid in result.output
    assert "set aside" in result.output  # django and pylint need network to grade here
    assert "cannot resolve instances" in result.output
    # Said up front and once, short, as a footnote; never the raw ConnectionError the agent logs.
    assert "expected here: without network, django__django-10973 and pylint-dev__pylint-4551" in result.output
    assert result.output.count("[1] agent_run_error: expected without network") == 1
    assert "ConnectionError" not in result.output
    assert any((tmp_path / "smoke" / "gym" / "results").rglob("*.json"))
    # The episodes it ran are in the store, and the command to read them closes the output.
    assert result.output.rstrip().endswith(f"miles-nemogym episodes {store}")
    table = CliRunner().invoke(app, ["episodes", str(store)])
    assert table.exit_code == 0, table.output
    row = next(line for line in table.output.splitlines() if line.startswith("train"))
    assert row.split()[:4] == ["train", "0", "5", "3"]  # five episodes, three graded offline
    # django's set-aside episode: the server's error whole, the policy's calls, the server's trajectory.
    (django,) = [e for e in reader.load(store).episodes if e.instance_id == DJANGO]
    shown = CliRunner().invoke(app, ["episodes", str(store), "--show", django.episode_id]).output
    assert "raw.githubusercontent.com" in shown and "ConnectionError" in shown
    assert re.search(
        r"^requests the policy answered \(counted by the run, not the server\): [1-9]$", shown, re.MULTILINE
    ), shown
    found = re.search(r"^the server's trajectory file: (.+)$", shown, re.MULTILINE)
    assert found, shown
    trajectory = Path(found[1])
    assert trajectory.is_file() and trajectory.name.endswith(".traj.json"), trajectory
    assert (tmp_path / "smoke") in trajectory.parents
