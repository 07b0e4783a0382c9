"""Agent rows: an ``NEMO_GYM_ENVS`` environment with an ``agent`` is played by that agent server's own
``POST /run`` (``gymnasium_agent``, ``tool_simulation_agent``, a routed ``simple_agent``), through the
same ``/run`` path as SWE (``episode/run.py``): the body carries the row and ``_ng_rollout_id`` (the
sample's policy URL, encoded for the routing model), the answer is scored against the environment's
reward range, a failure is named and masked, and the ledger names the agent server. A loopback
agent stand-in (``FaultServer`` answering with ``respond``)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from miles_nemogym import transport
from miles_nemogym.episode.record import ENV_KEY, TASK_ID_KEY
from miles_nemogym.errors import AGENT_RUN_ERROR, INVALID_CONFIG, SEED_FAILED, TRANSPORT_UNREACHABLE, VERIFIER_ERROR
from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import (
    policy_url_of,
    rollout_id,
)
from miles_nemogym.runtime import current, streak_stop
from miles_nemogym.settings import Settings, parse_environments
from tests.support.agent_fixtures import AGENT_ROW as ROW
from tests.support.agent_fixtures import ROLLOUT_SECRET, SESSION, call, fast_env
from tests.support.agent_fixtures import agent_answer as answer
from tests.support.fault_server import FaultServer
from tests.support.ports import free_port
from tests.support.runtime_settings import UseSettings

__all__ = ["fast_env"]
pytestmark = pytest.mark.usefixtures("fast_env")


@pytest.fixture
async def agent_server(use_settings: UseSettings) -> AsyncIterator[FaultServer]:
    srv = await FaultServer(result={}, respond=answer(reward=-1.0, info={"result": "loss"})).start()
    setting = {"blackjack": {"url": "http://127.0.0.1:9", "agent": srv.url, "reward_range": [-1, 1]}}
    use_settings(NEMO_GYM_ENVS=json.dumps(setting))
    yield srv
    await transport.close_pools()
    await srv.stop()


def test_a_rollout_id_is_the_policy_url_signed_in_nemo_gyms_alphabet() -> None:
    policy = "http://10.0.0.5:30000/sessions/0f3c9a/v1"
    encoded = rollout_id(policy, ROLLOUT_SECRET)
    assert re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*", encoded) and len(encoded) <= 2048
    assert policy_url_of(encoded, ROLLOUT_SECRET) == policy
    # Unsigned (the old form), signed with another secret, signed for another URL: no URL.
    unsigned = encoded.partition(".")[0]
    other = rollout_id("http://10.0.0.5:30000/sessions/ffff/v1", ROLLOUT_SECRET)
    forged = f"{unsigned}.{other.partition('.')[2]}"
    elsewhere = rollout_id(policy, "another-secret-of-at-least-32-characters")
    for refused in (unsigned, forged, elsewhere, "", "not/base64", "@@", f"{encoded}x", f"{encoded}.x"):
        assert policy_url_of(refused, ROLLOUT_SECRET) is None, refused
    with pytest.raises(ValueError, match="NEMO_GYM_ROLLOUT_SECRET is shorter than 32"):
        rollout_id(policy, "short")


async def test_an_agent_row_without_serves_rollout_secret_is_a_masked_invalid_config(
    agent_server: FaultServer, use_settings: UseSettings
) -> None:
    for value in (None, "", "too-short"):
        if value is None:
            use_settings(NEMO_GYM_ROLLOUT_SECRET=None)
        else:
            use_settings(NEMO_GYM_ROLLOUT_SECRET=value)
        record = (await call(dict(ROW)))["nemogym"]
        assert (record["mask_sample"], record["failure_kind"]) == (True, INVALID_CONFIG), value
        reason = record["failure_reason"]
        assert "NEMO_GYM_ROLLOUT_SECRET" in reason and "miles-nemogym serve" in reason, reason
        assert value is None or value == "" or value not in reason  # the value itself is never shown
    assert agent_server.bodies == []  # nothing was sent


async def test_an_agent_row_posts_its_agents_run_with_the_row_and_the_rollout_id(agent_server: FaultServer) -> None:
    out = await call(dict(ROW), request_kwargs={"temperature": 0.7, "max_tokens": 32})
    record = out["nemogym"]
    # -1 is a valid reward in blackjack's range: a measurement, not a failure.
    assert (record["status"], record["mask_sample"], record["environment"]) == ("ok", False, "blackjack")
    assert (out["reward"], record["server_reward"], record["turns"], record["instance_id"]) == (
        -1.0,
        -1.0,
        2,
        "blackjack/0",
    )
    assert out["eval_report"] == {"info": {"result": "loss"}}
    (body,) = agent_server.bodies
    assert policy_url_of(body["_ng_rollout_id"], ROLLOUT_SECRET) == f"{SESSION}/v1"
    assert body["agent_ref"] == ROW["agent_ref"] and ENV_KEY not in body and TASK_ID_KEY not in body
    params = body["responses_create_params"]
    assert (params["input"], params["temperature"], params["max_output_tokens"]) == (
        ROW["responses_create_params"]["input"],
        0.7,
        32,
    )


@pytest.mark.parametrize(
    ("respond", "kind", "reason"),
    [
        (answer(reward=2.0), VERIFIER_ERROR, "outside NEMO_GYM_ENVS['blackjack'].reward_range=[-1, 1]"),
        (answer(reward="1"), VERIFIER_ERROR, "not a number"),
        (answer(reward=0.0, mask_sample=True, failure_reason="sandbox died"), VERIFIER_ERROR, "sandbox died"),
        (
            lambda request: web.json_response("Hit an exception calling an inner server", status=500),
            AGENT_RUN_ERROR,
            "the agent's HTTP 500",
        ),
        (lambda request: web.Response(text="{", content_type="application/json"), AGENT_RUN_ERROR, "undecodable"),
    ],
)
async def test_an_agent_answer_that_is_no_measurement_is_a_named_masked_failure(
    agent_server: FaultServer, respond: Callable[[dict[str, Any]], web.Response], kind: str, reason: str
) -> None:
    agent_server.respond = respond
    out = await call(dict(ROW))
    record = out["nemogym"]
    assert (record["status"], record["mask_sample"], record["failure_kind"]) == ("failed", True, kind), record
    assert reason in record["failure_reason"] and out["reward"] == 0.0


async def test_an_unreachable_agent_is_waited_out_as_an_outage_naming_it(
    use_settings: UseSettings,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    use_settings(NEMO_GYM_ENVS=json.dumps({"blackjack": {"url": "http://127.0.0.1:9", "agent": url}}))
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="1")
    out = await call(dict(ROW))
    record = out["nemogym"]
    assert (record["status"], record["failure_kind"]) == ("failed", TRANSPORT_UNREACHABLE), record
    assert url in record["failure_reason"]
    assert current().circuits.stop_error() is not None and url in str(current().circuits.stop_error())


def test_the_streak_stop_names_the_agent_server_of_an_agent_row() -> None:
    settings = Settings.model_validate(
        {
            "NEMO_GYM_ENVS": json.dumps({"blackjack": {"url": "http://gym:1", "agent": "http://gym:2"}}),
            "NEMO_GYM_MAX_FAILURE_STREAK": 2,
        }
    )
    for _ in range(2):
        current().ledger.record_episode(AGENT_RUN_ERROR, "train", None, 0.0, environment="blackjack")
    stop = streak_stop(settings, current().ledger)
    assert stop is not None and "the blackjack agent server at http://gym:2 (NEMO_GYM_ENVS; x2)" in stop
    assert "resources server" not in stop


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"url": "http://g:1", "agent": "http://g:2/run"}, "'/run' is appended"),
        ({"url": "http://g:1", "agent": "ftp://g:2"}, "agent"),
        ({"url": "http://g:1", "reward_range": [1, -1]}, "reward_range"),
        ({"url": "http://g:1", "reward_range": [0, True]}, "reward_range"),
        ({"url": "http://g:1", "reward_range": "0,1"}, "reward_range"),
    ],
)
def test_a_bad_agent_or_reward_range_is_refused_naming_the_field(value: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match="environment 'b'") as raised:
        parse_environments(json.dumps({"b": value}))
    assert problem in str(raised.value)


def test_the_launcher_hands_the_job_an_agent_row_as_given() -> None:
    from miles_nemogym.launcher._command import environments_value
    from miles_nemogym.launcher._config import LauncherConfig

    given = {
        "blackjack": {"url": "http://gym:1", "agent": "http://gym:2", "reward_range": [-1, 1]},
        "mcqa": "http://g:3",
    }
    config = LauncherConfig.model_validate({"nemo_gym_envs": [json.dumps(given)]})
    value = json.loads(environments_value(config.nemo_gym_envs))
    assert value == {
        "blackjack": {"url": "http://gym:1", "agent": "http://gym:2", "reward_range": [-1.0, 1.0]},
        "mcqa": "http://g:3",
    }
    assert parse_environments(json.dumps(value))["blackjack"].agent == "http://gym:2"


async def test_a_gymnasium_environment_given_without_its_agent_is_masked_naming_the_fix(
    use_settings: UseSettings,
) -> None:
    async def reset(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()  # /reset (and /step), as a gymnasium server: /seed_session is a 404
    app.router.add_post("/reset", reset)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        use_settings(NEMO_GYM_ENVS=json.dumps({"blackjack": f"http://127.0.0.1:{port}"}))
        out = await call(dict(ROW))
    finally:
        await transport.close_pools()
        await runner.cleanup()
    record = out["nemogym"]
    assert (record["status"], record["failure_kind"]) == ("failed", SEED_FAILED), record
    assert "HTTP 404" in record["failure_reason"]
    assert "give its agent server in NEMO_GYM_ENVS (`miles-nemogym serve --env blackjack`" in record["failure_reason"]
