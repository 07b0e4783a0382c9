"""A Gym server that cannot be reached, or only part of the time, against real loopback servers:
the one resend mechanism (the circuit) ends every episode within the timeouts, stops the
run, catches a flapping server, charges each wait to its own role, and leaves no open pool."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym import agent, groups
from miles_nemogym.episode.record import eval_overrides
from miles_nemogym.errors import RunStopped
from miles_nemogym.runtime import current
from tests.support.agent_fixtures import ROLLOUT_SECRET, call, fast_env
from tests.support.circuits import waiting_episodes
from tests.support.clean_env import clean_environ
from tests.support.eventually import eventually
from tests.support.outage_servers import GradingServer
from tests.support.runtime_settings import UseSettings
from tests.support.samples import Sample, Status
from tests.support.tls import make_certificates

__all__ = ["fast_env"]  # fixture used by name
pytestmark = pytest.mark.usefixtures("fast_env")

ROOT = Path(__file__).resolve().parents[1]


class Args:
    n_samples_per_prompt = 4
    custom_reward_post_process_path = "miles_nemogym.groups.reward_post_process"


def rows(row: dict[str, Any], n: int) -> list[dict[str, Any]]:
    return [dict(row, instance_id=f"task-{i}") for i in range(n)]


async def test_a_refused_tls_certificate_fails_within_the_timeouts_and_stops_the_run(
    sympy_row: dict[str, Any], sympy_result: dict[str, Any], tmp_path: Path, use_settings: UseSettings
) -> None:
    server = await GradingServer(sympy_result, tls=make_certificates(tmp_path).server_context()).start()
    use_settings(NEMO_GYM_URL=server.url)
    use_settings(NEMO_GYM_RUN_TIMEOUT="5")
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="2")
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        outs = await asyncio.wait_for(asyncio.gather(*(call(row) for row in rows(sympy_row, 3))), 15)
    finally:
        await server.close()
    assert loop.time() - started < 8  # the outage timeout plus a probe, not a loop of resends
    for out in outs:
        assert out["nemogym"]["failure_kind"] == "miles_nemogym:transport_tls"
        assert out["nemogym"]["mask_sample"] is True and "certificate" in out["nemogym"]["failure_reason"]
    assert server.bodies == []  # no byte of a /run left before the handshake
    with pytest.raises(RunStopped, match=r"miles_nemogym:transport_tls.*certificate"):
        groups.check_episode_group(Args(), [Sample(metadata={}, status=Status.ABORTED)] * 4)


async def test_a_flapping_server_gets_every_episode_once(
    sympy_row: dict[str, Any], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    """Down for 6 s (an uncapped probe backoff grows to seconds meanwhile), then up 0.5 s in
    every 2 s: the probe must still catch a window before NEMO_GYM_OUTAGE_TIMEOUT."""
    server = GradingServer(sympy_result)
    use_settings(NEMO_GYM_URL=server.url)
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="15")
    tasks = rows(sympy_row, 8)
    pending = asyncio.gather(*(call(row) for row in tasks))
    try:
        await asyncio.sleep(4.5)
        server.flap(up_s=0.5, period_s=2.0)  # first up at 6 s
        outs = await asyncio.wait_for(pending, 30)
    finally:
        await server.close()
    assert [out["nemogym"]["status"] for out in outs] == ["ok"] * len(tasks)
    assert sorted(body["instance_id"] for body in server.bodies) == sorted(row["instance_id"] for row in tasks)
    assert current().circuits.stop_error() is None


async def test_an_eval_episodes_outage_wait_is_charged_to_its_eval_set(
    sympy_row: dict[str, Any], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    server = GradingServer(sympy_result)
    use_settings(NEMO_GYM_URL=server.url)
    episode = asyncio.ensure_future(call({**sympy_row, **eval_overrides("verified")}))
    try:
        # The wait is charged from when the episode's try found the server down, which comes
        # after its preparation (long on a loaded machine): the outage is timed from there.
        await eventually(lambda: waiting_episodes(current().circuits), "the episode waits out the outage")
        waiting_since = time.monotonic()
        await asyncio.sleep(1.0)
        down_s = time.monotonic() - waiting_since
        await server.start()
        out = await asyncio.wait_for(episode, 30)
    finally:
        await server.close()
    assert out["nemogym"]["status"] == "ok"
    evaluated, trained = current().ledger.drain("eval", "verified"), current().ledger.drain()
    assert evaluated.episodes == 1 and evaluated.outage_wait_s >= down_s
    assert (trained.episodes, trained.outage_wait_s) == (0, 0.0)


def test_agent_run_under_asyncio_run_leaves_no_unclosed_session(
    sympy_row: dict[str, Any], sympy_result: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "row.json").write_text(json.dumps(sympy_row))
    (tmp_path / "result.json").write_text(json.dumps(sympy_result))
    script = textwrap.dedent(
        """
        import asyncio, gc, json, os, sys
        from pathlib import Path
        from miles_nemogym import agent
        from tests.support.outage_servers import GradingServer

        folder = Path(sys.argv[1])

        async def main():
            server = await GradingServer(json.loads((folder / "result.json").read_text())).start()
            os.environ["NEMO_GYM_URL"] = server.url
            row = json.loads((folder / "row.json").read_text())
            out = await agent.run(base_url="http://127.0.0.1:1/sessions/s", metadata=row)
            print(out["nemogym"]["status"])
            await server.close()

        asyncio.run(main())
        gc.collect()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=clean_environ(NEMO_GYM_CONNECT_TIMEOUT="2", NEMO_GYM_ROLLOUT_SECRET=ROLLOUT_SECRET),  # fast_env's
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "Unclosed" not in done.stderr, done.stderr


async def test_a_blip_long_after_an_outage_ended_waits_instead_of_stopping_the_run(
    sympy_row: dict[str, Any], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    """A restart, then, past NEMO_GYM_OUTAGE_TIMEOUT, a one-second blip while the episode sent
    after the restart still runs: that episode was delivered, so the first outage is over and the
    blip's episode waits out a fresh one, instead of failing at once and stopping the run."""
    server = GradingServer(sympy_result, held=frozenset({"long"}))
    use_settings(NEMO_GYM_URL=server.url)
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="2")
    long = asyncio.ensure_future(call(dict(sympy_row, instance_id="long")))
    try:
        await eventually(lambda: waiting_episodes(current().circuits), "the first episode finds the server down")
        down_at = time.monotonic()
        await server.start()
        await eventually(lambda: len(server.bodies) == 1, "the first episode is delivered and runs")
        await eventually(lambda: time.monotonic() - down_at > 3, "the first outage is older than its timeout")
        await server.stop_listening()
        blip = asyncio.ensure_future(call(dict(sympy_row, instance_id="blip")))
        await eventually(
            lambda: waiting_episodes(current().circuits) or blip.done(), "the blip's episode finds it down"
        )
        await server.start()
        blipped = await asyncio.wait_for(blip, 30)
        server.release.set()
        first = await asyncio.wait_for(long, 30)
    finally:
        await server.close()
    assert (first["nemogym"]["status"], blipped["nemogym"]["status"]) == ("ok", "ok"), blipped["nemogym"]
    assert sorted(body["instance_id"] for body in server.bodies) == ["blip", "long"]
    assert current().circuits.stop_error() is None


async def test_an_abort_as_the_outage_ends_still_stops_the_waiting_episode(
    sympy_row: dict[str, Any], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    """Miles' abort() in the same loop turn as the wake-up of the episodes waiting out an outage
    (another episode's request went out): the abort must not be lost, the episode not sent."""
    server = GradingServer(sympy_result)
    use_settings(NEMO_GYM_URL=server.url)
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="60")
    episode = asyncio.ensure_future(call(sympy_row))
    try:
        await eventually(lambda: waiting_episodes(current().circuits), "the episode waits out the outage")
        current().circuits.for_url(server.url, "NEMO_GYM_URL").delivered()  # wakes the waiting episode
        current().in_flight.abort_all()
        out = await asyncio.wait_for(episode, 10)
    finally:
        await server.close()
    assert out["nemogym"]["failure_kind"] == "cancelled", out["nemogym"]
    assert server.bodies == []


async def test_an_episode_aborted_while_waiting_out_an_outage_charges_its_wait(
    sympy_row: dict[str, Any], sympy_result: dict[str, Any], use_settings: UseSettings
) -> None:
    """Miles' end-of-step abort stops the episodes still waiting for a server that is down: they
    are cancelled, and the time they waited is still in ``outage_wait_s``."""
    server = GradingServer(sympy_result)  # never listens
    use_settings(NEMO_GYM_URL=server.url)
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="60")
    episode = asyncio.ensure_future(call(sympy_row))
    await eventually(lambda: waiting_episodes(current().circuits), "the episode waits out the outage")
    waiting_since = time.monotonic()
    await eventually(lambda: time.monotonic() - waiting_since > 1, "the episode has waited a second")
    await agent.abort(None)
    out = await asyncio.wait_for(episode, 10)
    waited = time.monotonic() - waiting_since
    await server.close()
    assert out["nemogym"]["failure_kind"] == "cancelled"
    trained = current().ledger.drain()
    assert trained.cancelled == 1 and 1 < trained.outage_wait_s <= waited + 1, trained
