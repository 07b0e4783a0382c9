"""The routing model forwards only to a session: the real routing
model in the real NeMo-Gym server (blackjack's ``gymnasium_agent`` in front of it, as ``serve --env
blackjack`` starts them), a loopback ``HostileSession`` playing the session server.

Reaching the routing model's port is not enough: an id the trainer did not sign, another session's
path, another port or host, its own address, or a path that is not ``/sessions/<id>/v1`` is 403 and
nothing is sent. What is sent is sent once: a redirect is not followed, a connection dropped after
the request was read is not tried again. A session's 400 gets the in-process loop's rule."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from miles_nemogym.agent import run_with_settings
from miles_nemogym.episode.record import ENV_KEY, TASK_ID_KEY
from miles_nemogym.errors import AGENT_RUN_ERROR, POLICY_FAILED
from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import rollout_id
from miles_nemogym.settings import Settings
from miles_nemogym.transport import close_pools
from tests.support.environment_episodes import in_process_answer_to
from tests.support.hostile_session import (
    BAD_MAX_TOKENS,
    OVERFLOW,
    SESSION_PORTS,
    Act,
    HostileSession,
    session_id,
    turn,
)
from tests.support.routed_agents import RoutedAgents, model_base_urls, model_base_urls_at, running_routed_agents
from tests.support.runtime_settings import UseSettings
from tests.support.serve_process import exported, serving

pytestmark = pytest.mark.integration

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def blackjack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoutedAgents]:
    with running_routed_agents(["blackjack"], tmp_path_factory.mktemp("reach")) as agents:
        yield agents


@pytest.fixture
def session() -> Iterator[HostileSession]:
    with HostileSession().running() as server:
        yield server


def _post(agents: RoutedAgents, policy_url: str, *, signed: bool = True) -> httpx.Response:
    """A chat call to the routing model carrying ``policy_url``'s rollout id (signed or not)."""
    secret = agents.servers.rollout_secret
    rid = rollout_id(policy_url, secret) if signed else base64.urlsafe_b64encode(policy_url.encode()).decode()
    (base,) = model_base_urls(agents, rid.rstrip("="))
    return httpx.post(f"{base}/chat/completions", json=CHAT, timeout=60)


def test_a_session_the_trainer_signed_is_reached_once(blackjack: RoutedAgents, session: HostileSession) -> None:
    url = session.session_url(Act(body=turn("<action>stand</action>")))
    answer = _post(blackjack, f"{url}/v1")
    assert answer.status_code == 200, answer.text
    assert session.count() == 1 and session.count(url.rsplit("/", 1)[1]) == 1


def test_unsigned_forged_or_other_sessions_ids_are_refused_and_nothing_is_sent(
    blackjack: RoutedAgents, session: HostileSession
) -> None:
    mine = session.session_url(Act(body=turn("mine")))
    other = session.session_url(Act(body=turn("other")))
    signed_mine = rollout_id(f"{mine}/v1", blackjack.servers.rollout_secret)
    signed_other = rollout_id(f"{other}/v1", blackjack.servers.rollout_secret)
    # Another session's URL under my signature; my URL signed with another secret; no signature.
    forged = f"{signed_other.partition('.')[0]}.{signed_mine.partition('.')[2]}"
    guessed = rollout_id(f"{other}/v1", "a-secret-the-attacker-made-up-000000000")
    unsigned = base64.urlsafe_b64encode(f"{other}/v1".encode()).decode().rstrip("=")
    for rid in (forged, guessed, unsigned):
        (base,) = model_base_urls(blackjack, rid)
        answer = httpx.post(f"{base}/chat/completions", json=CHAT, timeout=60)
        assert answer.status_code == 403, (rid, answer.status_code, answer.text)
    assert session.count() == 0
    # The other session, signed for it by the trainer: reached.
    assert _post(blackjack, f"{other}/v1").status_code == 200 and session.count() == 1


def test_only_the_allowed_host_port_and_the_session_path_are_reached(
    blackjack: RoutedAgents, session: HostileSession
) -> None:
    sid = session_id()
    session.acts[sid] = Act(body=turn("ok"))
    port = session.port
    own = blackjack.servers.ports["policy_model"]
    refused = [
        f"http://127.0.0.1:{SESSION_PORTS[1] + 1}/sessions/{sid}/v1",  # another port (outside the range)
        f"http://10.9.9.9:{port}/sessions/{sid}/v1",  # another host
        f"http://localhost:{port}/sessions/{sid}/v1",  # other spellings of the host
        f"http://127.1:{port}/sessions/{sid}/v1",
        f"http://127.0.0.1.:{port}/sessions/{sid}/v1",
        f"http://[::ffff:127.0.0.1]:{port}/sessions/{sid}/v1",
        f"http://127.0.0.1\t:{port}/sessions/{sid}/v1",
        f"http://127.0.0.1:{own}/sessions/{sid}/v1",  # the routing model itself
        f"http://127.0.0.1:{port}/sessions/{sid}/../../health/v1",
        f"http://127.0.0.1:{port}/sessions/{sid}/v1/../../{sid}/v1",
        f"http://127.0.0.1:{port}/sessions/{sid}%2F..%2F/v1",
        f"http://127.0.0.1:{port}/sessions/{sid}/extra/v1",
        f"http://127.0.0.1:{port}/sessions/{sid}/v1/",
        f"http://127.0.0.1:{port}/sessions/{sid}/samples",
        f"http://127.0.0.1:{port}/sessions/not-a-session-id/v1",
        f"http://127.0.0.1:{port}/v1",
        f"http://127.0.0.1:{port}/sessions/{sid}/v1?x=1",
        f"http://127.0.0.1:{port}/sessions/{sid}/v1#x",
        f"http://127.0.0.1:{port}/sessions/{sid}/v1" + "/" * 2100,  # an id past the length limit
        f"http://u:p@127.0.0.1:{port}/sessions/{sid}/v1",
        f"http://127.0.0.1:{port}\\@10.9.9.9/sessions/{sid}/v1",
    ]
    for url in refused:
        answer = _post(blackjack, url)
        assert answer.status_code == 403, (url, answer.status_code, answer.text)
    # No id at all, and ids that are no encoding: no default model either.
    model = f"http://127.0.0.1:{own}"
    assert httpx.post(f"{model}/v1/chat/completions", json=CHAT, timeout=60).status_code == 403
    for garbage in ("x", "not-base64.at-all", "aHR0cA." + "A" * 43):
        (base,) = model_base_urls(blackjack, garbage)
        assert httpx.post(f"{base}/chat/completions", json=CHAT, timeout=60).status_code == 403, garbage
    assert session.count() == 0, session.received


def test_a_redirect_is_a_failed_call_never_followed(blackjack: RoutedAgents, session: HostileSession) -> None:
    with HostileSession().running() as elsewhere:
        target = elsewhere.session_url(Act(body=turn("<action>stand</action>")))
        url = session.session_url(Act(status=307, location=f"{target}/v1/chat/completions"))
        answer = _post(blackjack, f"{url}/v1")
        assert answer.status_code >= 500 and "307" in answer.text, answer.text
        assert session.count() == 1 and elsewhere.count() == 0


def test_a_call_read_before_the_connection_dropped_is_not_sent_again(
    blackjack: RoutedAgents, session: HostileSession
) -> None:
    url = session.session_url(Act(drop=True))
    answer = _post(blackjack, f"{url}/v1")
    assert session.count() == 1  # delivered once, never again
    assert answer.status_code >= 500 and "not sent again" in answer.text, answer.text


# -- a session's 400: one rule on both paths ----------------------------------------------------


def _settings(agents: RoutedAgents) -> Settings:
    return Settings.from_env().with_overrides(
        environments_text=agents.servers.setting(), rollout_secret=agents.servers.rollout_secret
    )


def _routed(agents: RoutedAgents, session_url: str) -> dict[str, Any]:
    row = agents.example_rows("blackjack")[0]
    metadata = {**row, ENV_KEY: "blackjack", TASK_ID_KEY: "blackjack/0"}

    async def play() -> dict[str, Any]:
        try:
            return await run_with_settings(_settings(agents), base_url=session_url, metadata=metadata)
        finally:
            await close_pools()

    return asyncio.run(play())


@pytest.mark.parametrize(
    ("body", "trained"),
    [(OVERFLOW, True), (BAD_MAX_TOKENS, False)],
    ids=["context-length-is-a-cut-off", "max-tokens-400-is-a-failure"],
)
def test_a_sessions_400_gets_one_rule_on_a_routed_agent_and_in_the_in_process_loop(
    blackjack: RoutedAgents, session: HostileSession, use_settings: UseSettings, body: bytes, trained: bool
) -> None:
    url = session.session_url(Act(status=400, body=body))
    routed = _routed(blackjack, url)["nemogym"]
    assert routed["mask_sample"] is (not trained), routed
    if not trained:  # an error to the agent, not a turn: its /run fails
        assert routed["failure_kind"] == AGENT_RUN_ERROR and "HTTP 400" in routed["failure_reason"], routed
    # The in-process loop, the same session answer: the same verdict as far as the trainer sees.
    use_settings(NEMO_GYM_CONNECT_TIMEOUT="5")
    loop = asyncio.run(_in_process(use_settings, body))
    assert loop["mask_sample"] is (not trained), loop
    if not trained:
        assert loop["failure_kind"] == POLICY_FAILED, loop


async def _in_process(use_settings: UseSettings, body: bytes) -> dict[str, Any]:
    try:
        return await in_process_answer_to(use_settings, 400, body)
    finally:
        await close_pools()


# -- serve: the secret's journey, and the routing model's own address ------------------------------


def _processes_holding(secret: str) -> list[tuple[str, dict[str, str]]]:
    """(command line, environment) of every readable process whose environment holds ``secret``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        assert secret not in cmdline, cmdline  # never in any argv
        if secret.encode() in environ:
            pairs = (item.partition(b"=") for item in environ.split(b"\0") if item)
            found.append((cmdline, {k.decode(): v.decode(errors="replace") for k, _, v in pairs}))
    return found


def test_serve_hands_its_secret_to_the_routing_model_alone_which_never_calls_itself(tmp_path: Path) -> None:
    import yaml

    from miles_nemogym.gym.venv import ensure_gym_venv

    state = tmp_path / "serve-state"
    environment = {k: v for k, v in os.environ.items() if k != "NEMO_GYM_ROLLOUT_SECRET"}
    # A range that takes in the routing model's own port: its own address is still refused.
    arguments = ["--no-swe", "--env", "blackjack", "--port", "0", "--state-dir", str(state)]
    with serving(*arguments, "--session-server", "127.0.0.1:1024-65535", env=environment) as serve:
        printed = exported(serve.printed)
        assert set(printed) == {"NEMO_GYM_ENVS", "NEMO_GYM_ROLLOUT_SECRET"}, serve.printed
        secret = printed["NEMO_GYM_ROLLOUT_SECRET"]
        assert len(secret) >= 32
        holders = _processes_holding(secret)
        assert [cmd.strip().endswith("miles_routing_model/app.py") for cmd, _ in holders] == [True], holders
        config = holders[0][1]["NEMO_GYM_CONFIG_DICT"]
        assert secret not in config  # not in the composed config every server reads
        own = yaml.safe_load(config)["policy_model"]["responses_api_models"]["miles_routing_model"]["port"]
        model = f"http://127.0.0.1:{own}"
        itself = rollout_id(f"{model}/sessions/{session_id()}/v1", secret)
        (base,) = model_base_urls_at(ensure_gym_venv().python, model, itself)
        answer = httpx.post(f"{base}/chat/completions", json=CHAT, timeout=60)
        assert answer.status_code == 403 and "own address" in answer.text, answer.text
        serve.stop()
    logs = [path for path in state.rglob("*") if path.is_file()]
    assert logs and not [path for path in logs if secret.encode() in path.read_bytes()]


def test_a_secret_the_user_gave_serve_is_used_and_never_echoed(tmp_path: Path) -> None:
    secret = f"user-secret-{session_id()}"
    environment = {**os.environ, "NEMO_GYM_ROLLOUT_SECRET": secret}
    arguments = ["--no-swe", "--env", "blackjack", "--port", "0", "--state-dir", str(tmp_path / "state")]
    with serving(*arguments, "--session-server", "127.0.0.1:31000", env=environment) as serve:
        assert set(exported(serve.printed)) == {"NEMO_GYM_ENVS"} and secret not in serve.printed, serve.printed
        assert "NEMO_GYM_ROLLOUT_SECRET: the value serve was started with" in serve.printed
        # serve (started with it) and the routing model hold it; no other server inherits it.
        holders = sorted("routing" if "miles_routing_model" in cmd else cmd for cmd, _ in _processes_holding(secret))
        assert len(holders) == 2 and holders[1] == "routing" and " serve " in holders[0], holders
        rest = serve.stop()
    assert secret not in rest
