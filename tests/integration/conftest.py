"""Fixtures that run the real NeMo-Gym ``mini_swe_agent_2`` server and Miles' own rollout.

``gym_server`` and ``gym_golden_server`` start once per test run, on first use, with
the ``local`` sandbox (this machine has no Docker) and stop at the end of the run,
with their Ray. The first run on a machine builds the server's Python 3.13 venv
(minutes, progress on stderr). A machine without Python 3.13 fails these tests with
the message saying how to install one: they are never skipped.

``miles_driver`` runs Miles' own rollout step (``tests/support/miles_harness.py``).

``rows`` and ``results`` are the wheel's five Verified rows (as our converter writes them
for Miles' ``--prompt-data``) and their real ``/run`` results, by instance id.

``gym_environments`` are the real 0.7.0 resources servers of every scripted environment
(``tests/support/env_scripts.py``), each with its ``simple_agent``, whose ``vllm_model`` calls
the scripted chat policy ``gym_chat``: started once per test run, on first use.

``recording_policy`` stands in for Miles' session server + SGLang where an episode is
driven without Miles: a loopback
OpenAI-compatible server at ``/sessions/<id>/v1/chat/completions`` that records
what the harness sends and answers as a scripted bash-tool policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.data import convert_row
from miles_nemogym.gym.config import ServeOptions
from miles_nemogym.gym.server import GymServer
from miles_nemogym.gym.venv import BuildLines, GymPythonNotFoundError
from tests.support.env_scripts import ENVIRONMENTS
from tests.support.gym_envs import GymEnvironments, running_environments
from tests.support.held_policy import HeldPolicy
from tests.support.judge_model import JudgeModel
from tests.support.miles_env import ensure_miles_env
from tests.support.miles_harness import MilesDriver, Terminal, env_or_fail, say
from tests.support.scripted_chat import ScriptedChat
from tests.support.threaded import serving_in_thread

# Small bounds: a scripted episode needs 3 model calls; grading on the host is seconds.
# Eight at once: a GRPO group of the recipe (n = 8) runs whole, as in training.
INTEGRATION_OPTIONS = {
    "sandbox": "local",
    "concurrency": 8,
    "step_limit": 10,
    "step_timeout": 120,
    "eval_timeout": 600,
}


def _serve(config: pytest.Config, options: ServeOptions, state_dir: Path) -> Iterator[GymServer]:
    # Build steps and pip's counts straight to the terminal, past pytest's capture: a silent
    # multi-minute venv build looks like a hang in CI logs.
    server = GymServer(options, state_dir=state_dir, progress=BuildLines("gym-venv", Terminal(config)))
    try:
        server.start()
    except GymPythonNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gym_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GymServer]:
    """The real server (local sandbox, normal mode); ``.url`` is its base URL.

    One per test run, shared by every test: GRPO groups (n episodes of one task) run on it
    concurrently, as in training (the server environment carries this package's fix for
    nemo-gym's per-instance config file, docs/upstream.md).
    """
    options = ServeOptions.model_validate(INTEGRATION_OPTIONS)
    yield from _serve(request.config, options, tmp_path_factory.mktemp("gym-server"))


@pytest.fixture(scope="session")
def gym_golden_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GymServer]:
    """The real server in golden mode (applies gold patches, never calls a model)."""
    options = ServeOptions.model_validate({**INTEGRATION_OPTIONS, "golden": True})
    yield from _serve(request.config, options, tmp_path_factory.mktemp("gym-golden-server"))


@pytest.fixture(scope="session")
def gym_chat() -> Iterator[ScriptedChat]:
    """The scripted chat policy (``tests/support/scripted_chat.py``) behind ``gym_environments``."""
    with ScriptedChat() as policy:
        yield policy


@pytest.fixture(scope="session")
def gym_environments(
    request: pytest.FixtureRequest, gym_chat: ScriptedChat, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GymEnvironments]:
    """The resources servers of ``ENVIRONMENTS``, their ``simple_agent``s and its ``vllm_model``
    (pointed at ``gym_chat``): ``resources_url(env)``, ``agent_url(env)``, ``example_rows(env)``."""
    with running_environments(list(ENVIRONMENTS), f"{gym_chat.url}/v1", tmp_path_factory.mktemp("gym-envs")) as servers:
        yield servers


@pytest.fixture
def recording_policy() -> Iterator[HeldPolicy]:
    """A scripted policy (2 look-around turns, then submit) in a background thread.

    Usable from sync and async tests. ``session_url(id)`` is Miles' ``base_url``;
    ``chat_requests(id)`` what that session received; ``hold_session(id)`` and
    ``release()`` hold its answers for abort tests (``arrivals(id)`` counts held requests too).
    """
    with HeldPolicy(look_around_turns=2) as policy:
        yield policy


@pytest.fixture(scope="module")
def judge() -> Iterator[JudgeModel]:
    """A loopback judge model (``tests/support/judge_model.py``) for a module's judged servers."""
    with serving_in_thread(JudgeModel()) as model:
        yield model


@pytest.fixture(scope="session")
def miles_driver(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilesDriver]:
    """One Miles driver process for the whole test session (Miles' imports take ~40 s).

    Builds the Miles venv and fetches the Miles source on first use (minutes, progress on
    stderr; ``MILES_SRC`` names a checkout or .tar.gz, else the pinned commit is cloned).
    Never skipped: a machine that cannot build it prints the reason once and fails each test.
    """
    progress = BuildLines("miles-env", Terminal(request.config))
    env = env_or_fail(request, "miles-env", lambda: ensure_miles_env(progress=progress))
    driver = MilesDriver(env, log_path=tmp_path_factory.mktemp("miles-driver") / "driver.log")
    say(request.config, f"[miles-driver] log: {driver.log_path}")
    try:
        yield driver
    finally:
        driver.close()


@pytest.fixture(scope="session")
def rows(gym_example_rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The wheel's Verified rows as our converter writes them, by instance id."""
    return {row["instance_id"]: convert_row(row) for row in gym_example_rows}


@pytest.fixture(scope="session")
def results(gym_example_rollouts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each row's real ``/run`` result, as the server answers the instance it was sent, by instance id."""
    return {result["instance_id"]: result for result in gym_example_rollouts}
