"""The real NeMo-Gym server, driven with raw ``/run`` requests.

These prove the fixtures and the facts the plugin builds on (docs/upstream.md,
NeMo-Gym): each ``/run`` reaches the policy at its own session URL with the
trainer's sampling parameters, graded episodes carry ``eval_report.tests_status``, the
django row comes back as ``{error, traceback}``, golden mode makes no model call, and
the server and its Ray leave nothing behind when stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.gym.config import ServeOptions
from miles_nemogym.gym.server import GymServer, GymServerError, free_port
from miles_nemogym.smoke._policy import RecordingPolicy
from tests.support.gym_runs import API_KEY, EXTRA_BODY, SAMPLING, assert_graded, post_run, run_body
from tests.support.policy_sessions import asked_sessions
from tests.support.ray_cluster import pids_with_environment
from tests.support.serve_process import serving

pytestmark = pytest.mark.integration

SYMPY = "sympy__sympy-20916"
DJANGO = "django__django-10973"
SPHINX = "sphinx-doc__sphinx-8595"
SKLEARN = "scikit-learn__scikit-learn-14141"


def assert_trainer_params_reached(policy: RecordingPolicy, session_id: str) -> None:
    requests = policy.chat_requests(session_id)
    assert len(requests) >= 2, f"session {session_id} got {len(requests)} chat requests"
    for request in requests:
        assert request.path == f"/sessions/{session_id}/v1/chat/completions"
        assert request.authorization == f"Bearer {API_KEY}"
        body = request.body
        assert body["temperature"] == SAMPLING["temperature"]
        assert body["top_p"] == SAMPLING["top_p"]
        assert body["max_tokens"] == SAMPLING["max_output_tokens"]
        assert body["top_k"] == EXTRA_BODY["top_k"]
        assert body["seed"] == EXTRA_BODY["seed"]
        assert body["parallel_tool_calls"] is True
        assert [tool["function"]["name"] for tool in body["tools"]] == ["bash"]
        assert not body.get("stream")


def test_openapi_lists_run(gym_server: GymServer) -> None:
    with urllib.request.urlopen(f"{gym_server.url}/openapi.json", timeout=30) as response:
        paths = json.load(response)["paths"]
    assert "/run" in paths
    assert "post" in paths["/run"]


async def test_sympy_run_reaches_its_session_with_the_trainer_params(
    gym_server: GymServer, recording_policy: RecordingPolicy, gym_example_rows: list[dict[str, Any]]
) -> None:
    session = "sympy-session"
    status, result = await post_run(
        gym_server.url, run_body(gym_example_rows, SYMPY, recording_policy.session_url(session))
    )
    assert status == 200
    assert result["instance_id"] == SYMPY
    assert_trainer_params_reached(recording_policy, session)
    assert_graded(result, SYMPY)
    # The trajectory holds the scripted bash calls, in order.
    calls = [item for item in result["response"]["output"] if item.get("type") == "function_call"]
    assert len(calls) == len(recording_policy.chat_requests(session))
    assert asked_sessions(recording_policy) == [session]
    # The server keeps each result (and the trajectory) under the fixture's results folder.
    saved = gym_server.results_dir / "verified" / "policy" / SYMPY / f"{SYMPY}.json"
    assert json.loads(saved.read_text())["metadata"] == result["metadata"]


async def test_concurrent_runs_stay_on_their_own_sessions(
    gym_server: GymServer, recording_policy: RecordingPolicy, gym_example_rows: list[dict[str, Any]]
) -> None:
    sessions = {SPHINX: "sphinx-session", SKLEARN: "sklearn-session"}
    results = await asyncio.gather(
        *(
            post_run(gym_server.url, run_body(gym_example_rows, iid, recording_policy.session_url(sid)))
            for iid, sid in sessions.items()
        )
    )
    for (status, result), (iid, sid) in zip(results, sessions.items(), strict=True):
        assert status == 200
        assert result["instance_id"] == iid
        assert_trainer_params_reached(recording_policy, sid)
        assert_graded(result, iid)
    assert sorted(asked_sessions(recording_policy)) == sorted(sessions.values())


async def test_django_row_comes_back_as_error_and_traceback(
    gym_server: GymServer, recording_policy: RecordingPolicy, gym_example_rows: list[dict[str, Any]]
) -> None:
    # Building django's eval script needs the network here (docs/upstream.md): the server
    # still answers 200, with reward 0.0 and {error, traceback} instead of a report.
    status, result = await post_run(
        gym_server.url, run_body(gym_example_rows, DJANGO, recording_policy.session_url("django-session"))
    )
    assert status == 200
    assert result["reward"] == 0.0
    metadata = result["metadata"]
    assert set(metadata) == {"error", "traceback"}
    assert metadata["error"]
    assert "Traceback" in metadata["traceback"]
    assert result["response"]["output"] == []


async def test_golden_mode_makes_no_model_call(
    gym_golden_server: GymServer, recording_policy: RecordingPolicy, gym_example_rows: list[dict[str, Any]]
) -> None:
    session = "golden-session"
    status, result = await post_run(
        gym_golden_server.url, run_body(gym_example_rows, SYMPY, recording_policy.session_url(session))
    )
    assert status == 200
    assert result["instance_id"] == SYMPY
    assert recording_policy.requests(session) == []
    # What was graded is the instance's gold patch (it cannot apply on this host: no repo).
    (row,) = [r for r in gym_example_rows if r["instance_id"] == SYMPY]
    metadata = result["metadata"]
    assert metadata["model_patch"] == row["patch"]
    report = metadata["eval_report"][SYMPY]
    assert result["reward"] == (1.0 if report["resolved"] else 0.0)


def test_stop_leaves_no_process_and_frees_the_port(tmp_path_factory: pytest.TempPathFactory) -> None:
    state = tmp_path_factory.mktemp("gym-stop")
    server = GymServer(ServeOptions(sandbox="local", concurrency=1), state_dir=state)
    # The server's config (in its environment, inherited by Ray) names the state folder.
    with server:
        assert pids_with_environment(str(state.resolve())), "the running server and its Ray"
        port = server.port
    assert not server.is_running()
    assert pids_with_environment(str(state.resolve())) == []
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    server.stop()  # idempotent


def test_a_server_that_cannot_bind_fails_with_its_log(tmp_path_factory: pytest.TempPathFactory) -> None:
    port = free_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        state = tmp_path_factory.mktemp("gym-busy")
        server = GymServer(ServeOptions(sandbox="local", port=port), state_dir=state, start_timeout=120)
        with pytest.raises(GymServerError) as caught:
            server.start()
    message = str(caught.value)
    assert "exited during start" in message or "did not answer" in message
    assert str(server.log_path) in message
    assert pids_with_environment(str(state.resolve())) == []


def test_serve_removes_its_own_state_folder_on_stop_and_no_link_is_followed(tmp_path: Path) -> None:
    temp, outside = tmp_path / "temp", tmp_path / "outside"
    temp.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("not serve's")
    arguments = ["--sandbox", "local", "--port", str(free_port()), "--concurrency", "1"]
    with serving(*arguments, env={**os.environ, "TMPDIR": str(temp)}) as serve:
        [made] = temp.glob("mng-gym-*")
        assert f"log:{made.resolve()}/server.log" in "".join(serve.printed.split()), serve.printed  # rich wraps
        (made / "a-link").symlink_to(outside, target_is_directory=True)
        rest = serve.stop()
    assert serve.process.returncode == 0, rest
    assert f"stopped;removed{made.resolve()}." in "".join(rest.split()), rest
    assert list(temp.iterdir()) == [] and (outside / "keep.txt").read_text() == "not serve's"


def test_serve_command_prints_the_url_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    state = tmp_path / "serve-state"
    port = free_port()
    arguments = ["--sandbox", "local", "--port", str(port), "--concurrency", "1", "--state-dir", str(state)]
    with serving(*arguments) as serve:
        assert f"export NEMO_GYM_URL=http://127.0.0.1:{port}" in serve.printed, serve.printed
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json", timeout=30) as response:
            assert "/run" in json.load(response)["paths"]
        rest = serve.stop()
    assert serve.process.returncode == 0, rest
    assert "stopped." in rest
    # The server's config (in its environment, inherited by Ray) names the state folder.
    assert pids_with_environment(str(state.resolve())) == []
    assert (state / "server.log").is_file()
