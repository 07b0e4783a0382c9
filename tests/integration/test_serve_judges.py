"""``serve --env`` for environments as nemo-gym 0.7.0 ships them, through its real parser and
servers: every shipped environment composes or is refused by name with a reason (one parser
process for all), a judged environment grades through the judge endpoint serve wires in (a
loopback judge stand-in), and a refusal names its reason, not the parser's config dump."""

from __future__ import annotations

import json
import os
import shlex
import stat
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from miles_nemogym.gym._judge_gate import CONNECT_TIMEOUT_S
from miles_nemogym.gym.composition import JUDGE_INSTANCE, JUDGE_KEY_ENV, Judge
from miles_nemogym.gym.config import ConfigRefusal
from miles_nemogym.gym.environments import EnvironmentServers, plan, refusals, shipped_environments
from miles_nemogym.gym.venv import GymEnvironmentError, GymVenv, ensure_gym_venv
from miles_nemogym.gym.wheel import read_member
from miles_nemogym.settings import Settings
from tests.support import environments_table
from tests.support.gym_envs import compose_each
from tests.support.judge_model import JUDGED_ENVIRONMENTS, JudgeModel
from tests.support.ports import free_port
from tests.support.ray_cluster import pids_with_environment
from tests.support.serve_process import Serving, serving
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.integration

STAND_IN_JUDGE = Judge(url="http://127.0.0.1:9/v1", model="judge")
[JUDGED] = JUDGED_ENVIRONMENTS


@pytest.fixture(scope="module")
def venv() -> GymVenv:
    return ensure_gym_venv()


@pytest.fixture(scope="module")
def composed(venv: GymVenv, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every shipped environment: planned (or refused by ``plan``), refused by serve's reading
    of its config, else composed by nemo-gym's parser (one process for all)."""
    outcome: dict[str, Any] = {}
    plans = []
    for name in shipped_environments():
        try:
            plans.extend(plan([name]))
        except GymEnvironmentError as error:
            outcome[name] = ("plan", str(error))
    judged = {p.name for p in plans if refusals([p], None)}
    outcome |= {
        name: ("parser", answer)
        for name, answer in compose_each(venv, plans, STAND_IN_JUDGE, tmp_path_factory.mktemp("compose")).items()
    }
    return {"outcome": outcome, "refused_without_judge": judged}


def test_every_shipped_environment_composes_or_is_refused_by_name_with_its_reason(composed: dict[str, Any]) -> None:
    outcome = composed["outcome"]
    assert len(outcome) == 143  # every resources server nemo-gym 0.7.0 ships
    for name, (stage, answer) in outcome.items():
        if stage == "plan":
            assert repr(name) in answer and len(answer) > 40, (name, answer)  # named, with its reason
        elif isinstance(answer, ConfigRefusal):
            # The parser's own error, never its config dump.
            assert "Found global config dict yaml" not in answer and "Error" in answer.split(":")[0], (name, answer)
        else:
            config = yaml.safe_load(answer)
            assert isinstance(config, dict) and config, name
    composes = {
        n for n, (stage, answer) in outcome.items() if stage == "parser" and not isinstance(answer, ConfigRefusal)
    }
    # spartqa: nemo-gym's parser rejected its dataset entries, which serve does not use.
    assert {"spartqa", "mcqa", "xlam_fc", "blackjack", "toolsandbox"} <= composes
    # With the judge endpoint given, every judged environment composes.
    assert {
        "aalcr",
        "abstention",
        "aegis_v4_safety",
        "bbq",
        "equivalence_llm_judge",
        "over_refusal_detection",
    } <= composes
    refused = {n for n, (stage, answer) in outcome.items() if stage == "parser" and isinstance(answer, ConfigRefusal)}
    assert refused == {"cvdp", "example_mcp_weather", "genrm_compare", "indian_banking"}, refused
    assert "Interpolation key 'anthropic_api_key' not found" in outcome["example_mcp_weather"][1]
    # The tables README and docs/environments.md carry agree: what they say serve starts, composes;
    # what the parser refuses, they say is refused.
    table = {r.name: r for r in environments_table.rows()}
    started = {n for n, r in table.items() if r.status != environments_table.REFUSED}
    assert started <= composes, started - composes
    assert refused <= set(table) - started


def test_without_a_judge_endpoint_the_judged_environments_are_refused(composed: dict[str, Any]) -> None:
    judged = composed["refused_without_judge"]
    shipped_list = {
        "aalcr", "abstention", "aegis_v4_safety", "bbq", "false_statement_judge", "gdp_pdf", "gdpval", "inverse_if",
        "labbench2_vlm", "math_with_autograder", "omniscience", "physics_judge", "simpleqa", "terminus_judge",
        "ugphysics_judge", "equivalence_llm_judge", "arena_judge", "over_refusal_detection",
    }  # fmt: skip
    assert shipped_list <= judged
    assert "math_with_judge" not in judged  # its shipped config turns its judge off (should_use_judge: false)


def test_a_refusal_among_several_environments_shows_its_reason_not_the_config(venv: GymVenv, tmp_path: Path) -> None:
    # A resources server block that fails nemo-gym's validation (an almost-server): its reasons are
    # printed by the parser before the error whose message is the whole config.
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump({"broken_env": {"resources_servers": {"mcqa": {"entrypoint": "app.py", "domain": 7}}}})
    )
    servers = EnvironmentServers(venv, plan(["mcqa", "xlam_fc", "workplace_assistant"]), state_dir=tmp_path / "s",
                                 extra_configs=[bad])  # fmt: skip
    with pytest.raises(GymEnvironmentError) as caught:
        servers.compose()
    said = str(caught.value)
    assert "Almost-Server Detected: 'broken_env'" in said and "domain" in said, said
    assert "Found global config dict yaml" not in said and "workplace_assistant" not in said


# ----------------------------------------------------------------------------- a judged environment


PASSWORD = f"pw-{uuid.uuid4().hex}"
"""The password in the judged serve's ``--judge-url``."""


@pytest.fixture(scope="module")
def judged_serve(judge: JudgeModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serving, str, Path]]:
    """``serve --no-swe --env abstention --judge-url <stand-in, with a password> --judge-model judge-model``
    as a process, the judge's key in its environment only."""
    key = f"sk-judge-{uuid.uuid4().hex}"
    state = tmp_path_factory.mktemp("judged")
    arguments = ["--no-swe", "--port", "0", "--state-dir", str(state), "--env", JUDGED]
    with_password = judge.url.replace("http://", f"http://grader:{PASSWORD}@")
    judge_flags = ["--judge-url", with_password, "--judge-model", "judge-model"]
    environment = {**os.environ, JUDGE_KEY_ENV: key, "HF_HUB_OFFLINE": "1"}
    with serving(*arguments, *judge_flags, env=environment) as serve:
        assert "export NEMO_GYM_ENVS=" in serve.printed, serve.printed
        yield serve, key, state
        rest = serve.stop()
    assert serve.process.returncode == 0, rest


def _verify(url: str, row: dict[str, Any], text: str) -> dict[str, Any]:
    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1700000000.0,
        "model": "policy",
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "status": "completed",
    }
    body = json.dumps({**row, "response": response}).encode()
    request = urllib.request.Request(f"{url}/verify", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        result: dict[str, Any] = json.load(answer)
    return result


def test_a_judged_environment_grades_through_the_judge_endpoint(
    judged_serve: tuple[Serving, str, Path], judge: JudgeModel
) -> None:
    serve, key, state = judged_serve
    exported = dict(
        shlex.split(line.strip())[1].split("=", 1) for line in serve.printed.splitlines() if "export " in line
    )
    url = Settings.from_env(exported).environments[JUDGED].url
    row = json.loads(read_member(f"resources_servers/{JUDGED}/data/example.jsonl").decode().splitlines()[0])
    right = _verify(url, row, f"\\boxed{{{row['answer']}}}")
    wrong = _verify(url, row, "\\boxed{Nobody in particular}")
    assert (right["reward"], right["verdict"], right["judge_output"]) == (1.0, "correct", "A")
    assert (wrong["reward"], wrong["verdict"], wrong["judge_output"]) == (0.0, "incorrect", "B")
    # Both were graded by the stand-in, as the configured model, with the key from the variable.
    assert len(judge.requests) == 2
    assert {r["model"] for r in judge.requests} == {"judge-model"}
    assert judge.authorizations == [f"Bearer {key}"] * 2
    prompts = [m["content"] for r in judge.requests for m in r["messages"] if m["role"] == "user"]
    assert f"Gold target: {row['answer']}" in prompts[0] and "Predicted answer: Nobody in particular" in prompts[1]
    # serve started the judge's model server, which calls serve's relay: only serve holds the key
    # and the --judge-url password (no other process, no composed config, log or file), and prints neither.
    assert (state / "environments" / f"{JUDGE_INSTANCE}.log").is_file()
    assert pids_with_environment(key) == [serve.process.pid]
    assert pids_with_environment(PASSWORD) == []  # serve has it from its arguments; no environment holds it
    for secret in (key, PASSWORD):
        assert secret not in serve.printed
        for path in state.rglob("*"):
            if path.is_file():
                assert secret not in path.read_text(errors="replace"), path


@pytest.fixture(scope="module")
def flaky_judge_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, str, Path]]:
    """A judged serve whose judge endpoint's port nothing listens on yet: (the environment's URL, that port,
    the judge's key, the state folder)."""
    key = f"sk-judge-{uuid.uuid4().hex}"
    port = free_port()
    state = tmp_path_factory.mktemp("flaky-judge")
    arguments = ["--no-swe", "--port", "0", "--state-dir", str(state), "--env", JUDGED]
    judge_flags = ["--judge-url", f"http://127.0.0.1:{port}/v1", "--judge-model", "judge-model"]
    environment = {**os.environ, JUDGE_KEY_ENV: key, "HF_HUB_OFFLINE": "1"}
    with serving(*arguments, *judge_flags, env=environment) as serve:
        assert "export NEMO_GYM_ENVS=" in serve.printed, serve.printed
        exported = dict(
            shlex.split(line.strip())[1].split("=", 1) for line in serve.printed.splitlines() if "export " in line
        )
        yield Settings.from_env(exported).environments[JUDGED].url, port, key, state
        rest = serve.stop()
    assert serve.process.returncode == 0, rest


def test_a_judge_that_is_down_fails_each_episode_at_once_and_a_401_only_its_own(
    flaky_judge_serve: tuple[str, int, str, Path],
) -> None:
    url, port, key, state = flaky_judge_serve
    row = json.loads(read_member(f"resources_servers/{JUDGED}/data/example.jsonl").decode().splitlines()[0])
    right = f"\\boxed{{{row['answer']}}}"
    # Down: each judged episode fails within the relay's connect timeout, set aside with nemo-gym's kind
    # (nemo-gym's judge model server retried a refused connection for ever: every episode stalled).
    for _ in range(2):
        started = time.monotonic()
        down = _verify(url, row, right)
        assert time.monotonic() - started < CONNECT_TIMEOUT_S
        assert (down["failure_kind"], down["mask_sample"], down["reward"]) == ("judge_failed", True, 0.0)
    with serving_in_thread(JudgeModel(port=port)) as judge:
        assert _verify(url, row, right)["reward"] == 1.0  # back up: judged again, no restart
        # One 401 naming a bad key (and echoing it) fails that episode alone; the next one is judged.
        judge.refusals = 1
        refused = _verify(url, row, right)
        assert (refused["failure_kind"], refused["mask_sample"]) == ("judge_failed", True)
        assert key not in json.dumps(refused)
        assert _verify(url, row, right)["reward"] == 1.0
        assert len(judge.requests) == 3
    # The relay's log says why each failed, without the echoed key; serve's logs are its own.
    relay = (state / "environments" / f"{JUDGE_INSTANCE}.relay.log").read_text()
    assert relay.count(f"the judge endpoint http://127.0.0.1:{port}/v1 is unreachable: Connection refused") >= 2
    assert "refused the call (HTTP 401: " in relay and "Incorrect API key provided: Bearer ***" in relay
    logs = list(state.rglob("*.log"))
    for path in state.rglob("*"):
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path
    for path in logs:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
