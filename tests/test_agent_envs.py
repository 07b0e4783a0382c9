"""``agent.run`` routes environment rows to the ``simple_agent`` loop and SWE rows to ``/run``;
everything downstream (record, ledger, store, salvage, eval roles, ``abort``, the outage
circuit per server, ``agent_metrics``) works for both. Real loopback servers: a resources
server stand-in (``fake_resources``), a scripted policy, and the ``/run`` fault server."""

from __future__ import annotations

import asyncio
import copy
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym import agent, groups, transport
from miles_nemogym.episode.record import ROW_MARKS, eval_overrides
from miles_nemogym.errors import RunStopped
from miles_nemogym.groups import check_run
from miles_nemogym.runtime import current
from miles_nemogym.store import _reader as reader
from tests.support.agent_fixtures import ROLLOUT_SECRET, call, fast_env, server
from tests.support.circuits import is_open, waiting_episodes
from tests.support.clean_env import clean_environ
from tests.support.environment_episodes import MILES_KEYS, chat, env_row, envs, run_env
from tests.support.eventually import eventually
from tests.support.fake_resources import fake_resources, row
from tests.support.fault_server import FaultServer
from tests.support.pools import open_pools
from tests.support.ports import free_port
from tests.support.runtime_settings import UseSettings
from tests.support.samples import Sample, Status
from tests.support.scripted_chat import ScriptedChat, Turn, tag, tool

__all__ = ["chat", "fast_env", "server"]  # fixtures used by name
pytestmark = pytest.mark.usefixtures("fast_env")

ROOT = Path(__file__).resolve().parents[1]


async def test_an_environment_row_runs_the_loop_and_a_swe_row_runs_run(
    server: FaultServer, chat: ScriptedChat, sympy_row: dict[str, Any], use_settings: UseSettings
) -> None:
    async with fake_resources() as fake:
        envs(use_settings, mcqa=fake.url)
        out = await run_env(chat, env_row("mcqa"))
        assert server.bodies == []  # nothing went to /run
        assert len(fake.seeded) == 1 and len(fake.verified) == 1
        swe = await call(sympy_row)
    record = out["nemogym"]
    assert (record["status"], record["environment"], record["instance_id"]) == ("ok", "mcqa", "mcqa/1")
    assert (out["reward"], record["server_reward"], record["turns"], record["tool_calls"]) == (1.0, 1.0, 2, 1)
    assert len(server.bodies) == 1 and len(fake.seeded) == 1  # the SWE row went to /run only
    assert (swe["nemogym"]["status"], swe["nemogym"]["environment"]) == ("ok", "swe")
    assert "agent_metrics" not in swe  # /run's time is generation and tools together


async def test_marks_bookkeeping_and_returned_keys_never_reach_the_resources_server(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    task = row(tag("gold"), expected_answer="B")
    previous = {"reward": 1.0, "eval_report": {"x": 1}, "nemogym": {"status": "ok"}, "agent_metrics": {"a": 1}}
    bench = {"nemogym_benchmark": {"name": "b", "environment": "mcqa", "num_repeats": 8}}  # convert's mark
    metadata = {**env_row("mcqa"), **eval_overrides("held"), **previous, **bench, "policy_api_key": "sk-row"}
    async with fake_resources() as fake:
        envs(use_settings, mcqa=fake.url)
        out = await run_env(chat, metadata)
    assert out["nemogym"]["status"] == "ok"
    assert list(fake.seeded.values()) == [task]
    verified = {key: value for key, value in fake.verified[0].items() if key != "response"}
    assert verified == task
    assert not ROW_MARKS & set(fake.verified[0])


async def test_a_row_marked_with_an_unconfigured_environment_is_invalid_config_logged_once(
    server: FaultServer, chat: ScriptedChat, use_settings: UseSettings, caplog: pytest.LogCaptureFixture
) -> None:
    async with fake_resources() as fake:
        envs(use_settings, mcqa=fake.url)
        with caplog.at_level(logging.ERROR, logger="miles_nemogym.agent"):
            outs = [await run_env(chat, env_row("xlam_fc", "unrouted", task=str(i))) for i in range(3)]
        assert len([r for r in caplog.records if "xlam_fc" in r.getMessage()]) == 1
        use_settings(NEMO_GYM_ENVS=None)  # a new run (runtime) without it
        unset = await run_env(chat, env_row("xlam_fc"))
    for out in outs:
        record = out["nemogym"]
        assert (record["failure_kind"], record["mask_sample"]) == ("miles_nemogym:invalid_config", True)
        assert record["environment"] == "xlam_fc" and record["instance_id"].startswith("xlam_fc/")
    reason = outs[0]["nemogym"]["failure_reason"]
    assert "'xlam_fc'" in reason and "NEMO_GYM_ENVS" in reason and "it names mcqa" in reason
    assert "serve --env xlam_fc" in reason
    assert "it is unset" in unset["nemogym"]["failure_reason"]
    assert fake.seeded == {} and server.bodies == []
    assert chat.requests("unrouted") == []


async def test_nemo_gym_agent_ref_routes_an_unmarked_row(
    server: FaultServer, chat: ScriptedChat, use_settings: UseSettings
) -> None:
    ref = {"type": "responses_api_agents", "name": "mcqa_simple_agent"}
    async with fake_resources() as fake:
        envs(use_settings, mcqa=fake.url)
        out = await run_env(chat, {**row(tag("plain")), "agent_ref": ref, "nemogym_task_id": "mcqa/7"})
    assert (out["nemogym"]["status"], out["nemogym"]["environment"]) == ("ok", "mcqa")
    assert len(fake.seeded) == 1 and server.bodies == []


async def test_an_agent_ref_is_read_by_the_rule_convert_applies(
    server: FaultServer, chat: ScriptedChat, use_settings: UseSettings
) -> None:
    # NeMo-Gym names environment X's agent X_simple_agent; a bare "mcqa" names no agent of it,
    # as `convert` reads it too (data/_environments.py), so the row is not routed there.
    from miles_nemogym.data._environments import environment_of_row

    ref = {"type": "responses_api_agents", "name": "mcqa"}
    assert not isinstance(environment_of_row({"agent_ref": ref}), str)
    async with fake_resources() as fake:
        envs(use_settings, mcqa=fake.url)
        out = await run_env(chat, {**row(tag("plain")), "agent_ref": ref, "nemogym_task_id": "mcqa/7"})
    assert out["nemogym"]["environment"] == "swe" and not fake.seeded


async def test_an_agent_ref_naming_no_configured_environment_stays_a_swe_row(
    server: FaultServer, sympy_row: dict[str, Any], use_settings: UseSettings
) -> None:
    envs(use_settings, mcqa="http://127.0.0.1:1")
    out = await call({**sympy_row, "agent_ref": {"type": "responses_api_agents", "name": "swe_agents"}})
    assert (out["nemogym"]["status"], out["nemogym"]["environment"]) == ("ok", "swe")
    assert len(server.bodies) == 1


async def test_record_ledger_store_and_tool_time_of_an_environment_episode(
    chat: ScriptedChat, use_settings: UseSettings, tmp_path: Path
) -> None:
    use_settings(NEMO_GYM_EPISODE_DIR=str(tmp_path))
    async with fake_resources(delay=0.05, extra={"extracted_answer": "B"}) as fake:
        envs(use_settings, mcqa=fake.url)
        started = time.monotonic()
        trained = await run_env(chat, env_row("mcqa"))
        evaluated = await run_env(chat, {**env_row("mcqa", task="2"), **eval_overrides("mcqa_holdout")})
        took = time.monotonic() - started
    record = trained["nemogym"]
    assert record["attempts"] == 1 and record["elapsed_s"] > 0 and record["episode_id"]
    assert record["episode_id"] != evaluated["nemogym"]["episode_id"]
    assert trained["eval_report"] == {"extracted_answer": "B"}  # the environment's own /verify fields
    tool_time = trained["agent_metrics"]["total_tool_time"]
    assert 3 * 0.05 <= tool_time <= record["elapsed_s"] < took  # seed + one tool + verify
    assert current().ledger.drain().episodes == 1
    assert current().ledger.drain("eval", "mcqa_holdout").episodes == 1
    current().stores.get(str(tmp_path)).flush()
    stored = {(e.role, e.record["environment"], e.instance_id) for e in reader.load(tmp_path).episodes}
    assert stored == {("train", "mcqa", "mcqa/1"), ("eval", "mcqa", "mcqa/2")}


async def test_reward_range_applies_to_an_environment_reward(chat: ScriptedChat, use_settings: UseSettings) -> None:
    async with fake_resources(reward=2.0) as fake:
        envs(use_settings, mcqa=fake.url)
        outside = await run_env(chat, env_row("mcqa", "plain"))
        # A new run with changed settings; the reward mode counts SWE tests only: no effect here.
        use_settings(NEMO_GYM_REWARD_RANGE="0,5", NEMO_GYM_REWARD_MODE="partial")
        inside = await run_env(chat, env_row("mcqa", "plain"))
    record = outside["nemogym"]
    assert (record["failure_kind"], record["server_reward"], outside["reward"]) == ("verifier_error", 2.0, 0.0)
    assert "NEMO_GYM_REWARD_RANGE" in record["failure_reason"]
    assert (inside["nemogym"]["status"], inside["reward"]) == ("ok", 2.0)


async def test_a_failed_environment_episode_is_held_for_its_aborted_sample_by_task(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    async with fake_resources(seed="500") as fake:
        envs(use_settings, mcqa=fake.url)
        failed = await run_env(chat, env_row("mcqa", "unseeded", task="9"))
    assert failed["nemogym"]["failure_kind"] == "miles_nemogym:seed_failed"
    assert chat.requests("unseeded") == []  # no model call: Miles returns the input sample ABORTED
    aborted = Sample(prompt=[], metadata=env_row("mcqa", task="9"), index=0, group_index=0, status=Status.ABORTED)
    valid = Sample(prompt=[], metadata=copy.deepcopy(env_row("mcqa", task="9")), index=1, group_index=0)
    valid.metadata["nemogym"] = {"status": "ok", "episode_id": "e-valid", "environment": "mcqa"}
    valid.tokens, valid.response_length, valid.loss_mask = [1, 2, 3], 1, [1]
    assert groups.recover_failed_episodes(current().held, [aborted, valid]) == 1
    assert aborted.metadata["nemogym"]["episode_id"] == failed["nemogym"]["episode_id"]
    assert aborted.remove_sample is True


@pytest.mark.parametrize("where", ["awaiting_result", "not_delivered"])
async def test_abort_stops_an_environment_episode(chat: ScriptedChat, use_settings: UseSettings, where: str) -> None:
    async with fake_resources(delay=2) as fake:
        url = fake.url if where == "awaiting_result" else f"http://127.0.0.1:{free_port()}"
        envs(use_settings, mcqa=url)
        task = asyncio.create_task(run_env(chat, env_row("mcqa")))
        if where == "awaiting_result":  # the seed reached the server, which holds it for 2 s
            await eventually(lambda: fake.received, "the seed request reached the server")
        else:  # nothing listens: the episode waits out the outage, nothing delivered
            await eventually(lambda: waiting_episodes(current().circuits), "the episode waits for the server")
        assert not task.done()
        await agent.abort()
        out = await asyncio.wait_for(task, 5)
    record = out["nemogym"]
    assert (record["failure_kind"], record["mask_sample"], record["environment"]) == ("cancelled", True, "mcqa")
    assert ("before the request reached" in record["failure_reason"]) == (where == "not_delivered")
    assert out["agent_metrics"] == {"total_tool_time": 0.0}  # Miles reads it from every environment episode
    assert current().ledger.drain().cancelled == 1
    assert current().held.clear() == 0  # a cancelled episode is never held


async def test_one_resources_server_down_holds_only_its_own_episodes_until_it_is_back(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    port = free_port()
    down_url = f"http://127.0.0.1:{port}"
    async with fake_resources() as other:
        envs(use_settings, mcqa=down_url, xlam_fc=other.url)
        waiting = [asyncio.create_task(run_env(chat, env_row("mcqa", task=str(i)))) for i in range(3)]
        await eventually(
            lambda: waiting_episodes(current().circuits) == 3, "the three mcqa episodes wait for their server"
        )
        finished = await asyncio.wait_for(
            asyncio.gather(*(run_env(chat, env_row("xlam_fc", task=str(i))) for i in range(3))), 10
        )
        assert [out["nemogym"]["status"] for out in finished] == ["ok"] * 3
        assert not any(task.done() for task in waiting)
        assert is_open(current().circuits.for_url(down_url, "NEMO_GYM_ENVS"))
        assert not is_open(current().circuits.for_url(other.url, "NEMO_GYM_ENVS"))
        async with fake_resources(port=port) as back:
            outs = await asyncio.wait_for(asyncio.gather(*waiting), 10)
    assert [out["nemogym"]["status"] for out in outs] == ["ok"] * 3
    assert all(out["nemogym"]["attempts"] >= 2 for out in outs)
    assert len(back.seeded) == 3 and len(back.verified) == 3  # each seeded once, once it was back
    assert current().ledger.drain().outage_wait_s > 0


async def test_a_tool_call_that_may_have_been_delivered_is_masked_not_run_again(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    chat.script("drop", Turn(tool_calls=(tool("drop"),)), Turn(content="done"))
    async with fake_resources() as fake:
        envs(use_settings, mcqa=fake.url)
        out = await asyncio.wait_for(run_env(chat, env_row("mcqa", "drop")), 10)
    record = out["nemogym"]
    assert (record["failure_kind"], record["attempts"]) == ("transport_peer_drop", 1)
    assert len(fake.seeded) == 1 and len(fake.tool_calls) == 1 and fake.verified == []


async def test_a_tool_call_to_a_server_gone_after_the_seed_is_masked_not_run_again(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    chat.script("gone", Turn(tool_calls=(tool("echo", a=1),), delay_s=1.0), Turn(content="done"))
    port = free_port()
    async with fake_resources(port=port) as fake:
        envs(use_settings, mcqa=fake.url)
        task = asyncio.create_task(run_env(chat, env_row("mcqa", "gone")))
        await eventually(lambda: fake.seeded, "the episode's session was seeded")
    # The server is gone while the policy writes its tool call: the episode's session was there.
    out = await asyncio.wait_for(task, 10)
    record = out["nemogym"]
    assert (record["failure_kind"], record["attempts"], record["turns"]) == ("transport_unreachable", 1, 1)
    assert len(fake.seeded) == 1 and fake.tool_calls == []
    assert not is_open(current().circuits.for_url(fake.url, "NEMO_GYM_ENVS"))


async def test_a_resources_outage_past_its_timeout_fails_its_episodes_and_stops_the_run(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="1")
    down_url = f"http://127.0.0.1:{free_port()}"
    envs(use_settings, mcqa=down_url)
    out = await asyncio.wait_for(run_env(chat, env_row("mcqa")), 10)
    record = out["nemogym"]
    assert (record["failure_kind"], record["mask_sample"]) == ("transport_unreachable", True)
    assert "NEMO_GYM_OUTAGE_TIMEOUT=1s" in record["failure_reason"]
    with pytest.raises(RunStopped, match="NEMO_GYM_ENVS") as stopped:
        check_run(current().settings)
    assert down_url in str(stopped.value)


async def test_one_connection_pool_per_event_loop_for_environment_episodes(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    async with fake_resources() as fake:
        envs(use_settings, mcqa=fake.url)
        first = await transport.pool(current().settings.max_concurrency)
        outs = [await run_env(chat, env_row("mcqa", "plain", task=str(i))) for i in range(5)]
        assert [out["nemogym"]["status"] for out in outs] == ["ok"] * 5 and len(fake.seeded) == 5
        assert len(fake.peers) == 1  # one pool: each episode reused the previous one's connection
        assert await transport.pool(current().settings.max_concurrency) is first
        assert open_pools() == 1
        await transport.close_pools()
        assert open_pools() == 0


def test_an_environment_episode_under_asyncio_run_leaves_no_unclosed_session(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import asyncio, gc, json, os
        from miles_nemogym import agent
        from tests.support.fake_resources import fake_resources, row
        from tests.support.scripted_chat import ScriptedChat, Turn, tag, tool

        async def main(chat):
            async with fake_resources() as fake:
                os.environ["NEMO_GYM_ENVS"] = json.dumps({"mcqa": fake.url})
                metadata = {**row(tag("gold")), "nemogym_env": "mcqa", "nemogym_task_id": "mcqa/1"}
                out = await agent.run(base_url=chat.session_url("s"), metadata=metadata)
                print(out["nemogym"]["status"], out["nemogym"]["environment"])

        with ScriptedChat() as chat:
            chat.script("gold", Turn(tool_calls=(tool("echo", a=1),)), Turn(content="done"))
            asyncio.run(main(chat))
        gc.collect()
        """
    )
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=clean_environ(NEMO_GYM_CONNECT_TIMEOUT="2", NEMO_GYM_ROLLOUT_SECRET=ROLLOUT_SECRET),  # fast_env's
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok mcqa"
    assert "Unclosed" not in done.stderr, done.stderr


async def test_a_failure_streak_names_the_servers_it_came_from(chat: ScriptedChat, use_settings: UseSettings) -> None:
    use_settings(NEMO_GYM_MAX_FAILURE_STREAK="3")
    async with fake_resources(seed="500") as fake:
        envs(use_settings, mcqa=fake.url)
        for i in range(3):
            await run_env(chat, env_row("mcqa", "unseeded", task=str(i)))
    with pytest.raises(RunStopped, match="miles_nemogym:seed_failed x3") as stopped:
        check_run(current().settings)
    assert f"the mcqa resources server at {fake.url} (NEMO_GYM_ENVS; x3)" in str(stopped.value)
    assert "NEMO_GYM_URL" not in str(stopped.value)


@pytest.mark.parametrize("base_url", ["not a url", "ftp://h/sessions/s", "http://[::1/sessions/s"])
async def test_an_environment_row_with_a_session_url_that_is_not_http_is_refused_before_anything_is_sent(
    use_settings: UseSettings, base_url: str
) -> None:
    async with fake_resources() as fake:
        envs(use_settings, mcqa=fake.url)
        out = await call({**env_row("mcqa"), **MILES_KEYS}, base_url=base_url)
        assert not fake.seeded and not fake.verified
    record = out["nemogym"]
    assert record["mask_sample"] is True and record["attempts"] == 0
    assert record["failure_kind"] == "miles_nemogym:invalid_request"
    assert "base_url" in record["failure_reason"] and "Miles passes http://" in record["failure_reason"]
