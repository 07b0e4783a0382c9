"""Whose fault is a timeout: an episode's deadline (``NEMO_GYM_RUN_TIMEOUT``) that passes while the
policy held the episode -- a ``/run`` whose Miles session recorded a model call, an environment
episode after its first model turn (a model or tool call) -- is trained as
``miles_nemogym:policy_timeout``, scored the episode's lowest reward (``NEMO_GYM_TIMEOUT_REWARD=lowest``,
the default) or 0 (``zero``), or set aside (``mask``); one waiting on infrastructure (a seed or
``/verify`` never answered, an answer cut mid-way, a first model call never answered, a ``/run``
whose session recorded no call or cannot be asked) is always set aside as ``agent_timeout``.
Loopback servers stall on events; the deadline is one second."""

from __future__ import annotations

import json
from typing import Any

import pytest

from miles_nemogym import agent, groups, metrics
from miles_nemogym.episode.record import ENV_KEY, TASK_ID_KEY
from miles_nemogym.errors import AGENT_TIMEOUT, POLICY_TIMEOUT
from miles_nemogym.runtime import current
from tests.support.agent_fixtures import call, fast_env
from tests.support.environment_episodes import ENV, chat, env_row, envs, episode, masked, run_env, within
from tests.support.fake_resources import fake_resources
from tests.support.runtime_settings import UseSettings
from tests.support.samples import Sample
from tests.support.scripted_chat import ScriptedChat, Turn, tool
from tests.support.stalling import stalling_server

__all__ = ["chat", "fast_env"]  # fixtures used by name
pytestmark = pytest.mark.usefixtures("fast_env")

AGENT_ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Deal me in."}]},
    ENV_KEY: "blackjack",
    TASK_ID_KEY: "blackjack/0",
}
POLICY = (False, 0.0, POLICY_TIMEOUT)
"""(masked, reward trained on, kind) of a timeout graded like a step limit, in a range from 0."""
SET_ASIDE = (True, 0.0, AGENT_TIMEOUT)
BY_SETTING = [(None, POLICY), ("zero", POLICY), ("mask", SET_ASIDE)]
"""``NEMO_GYM_TIMEOUT_REWARD`` (None: the default, ``lowest``) and what a policy's timeout gets in [0, 1]."""


@pytest.fixture(autouse=True)
def half_a_second(use_settings: UseSettings) -> None:
    use_settings(NEMO_GYM_RUN_TIMEOUT="0.5")


async def run_row(
    use_settings: UseSettings, kind: str, url: str, row: dict[str, Any], session: str | None = None
) -> dict[str, Any]:
    """``agent.run`` of ``row`` as a SWE ``/run`` (``kind`` ``swe``) or an agent row to the server at
    ``url``, for Miles' session ``session`` (default: one nothing listens on)."""
    if kind == "swe":
        use_settings(NEMO_GYM_URL=url)
    else:
        setting = {"blackjack": {"url": "http://127.0.0.1:9", "agent": url, "reward_range": [-1, 1]}}
        use_settings(NEMO_GYM_ENVS=json.dumps(setting))
    given = {"base_url": session} if session else {}
    out, _ = await within(10, call(row if kind == "swe" else dict(AGENT_ROW), **given))
    return out


# --- /run: SWE and agent rows ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["swe", "agent"])
@pytest.mark.parametrize(("setting", "expected"), BY_SETTING)
async def test_a_run_past_the_deadline_after_a_model_call_is_the_policys(
    use_settings: UseSettings, sympy_row: dict[str, Any], kind: str, setting: str | None, expected: Any
) -> None:
    use_settings(NEMO_GYM_TIMEOUT_REWARD=setting)
    async with stalling_server("held", calls=2) as server:
        out = await run_row(use_settings, kind, server.url, sympy_row, server.session_url)
        assert server.received.is_set()  # delivered: the server was playing the episode
    if kind == "agent" and setting is None:
        expected = (False, -1.0, POLICY_TIMEOUT)  # blackjack's range is [-1, 1]: a stall scores a loss
    assert masked(out) == expected
    assert "NEMO_GYM_RUN_TIMEOUT=0.5s" in out["nemogym"]["failure_reason"]
    assert out["nemogym"]["attempts"] == 1


@pytest.mark.parametrize("kind", ["swe", "agent"])
@pytest.mark.parametrize("asked", ["no call recorded", "session unreachable"])
async def test_a_run_past_the_deadline_before_any_model_call_is_set_aside(
    use_settings: UseSettings, sympy_row: dict[str, Any], kind: str, asked: str
) -> None:
    """A sandbox that never started, a server that never played: nothing of the policy's to grade."""
    async with stalling_server("held", calls=0) as server:
        session = server.session_url if asked == "no call recorded" else None
        out = await run_row(use_settings, kind, server.url, sympy_row, session)
        assert server.received.is_set()
    assert masked(out) == SET_ASIDE


@pytest.mark.parametrize("kind", ["swe", "agent"])
async def test_a_run_answer_cut_mid_way_at_the_deadline_is_set_aside(
    use_settings: UseSettings, sympy_row: dict[str, Any], kind: str
) -> None:
    """The server began its answer and stopped: infrastructure, whatever the setting says, though
    its session recorded the episode's model calls (as it has for every episode a /run answers)."""
    async with stalling_server("mid_answer", calls=2) as server:
        out = await run_row(use_settings, kind, server.url, sympy_row, server.session_url)
    assert masked(out) == SET_ASIDE


# --- the in-process loop ---------------------------------------------------------------------


LOW = (False, -64.0, POLICY_TIMEOUT)
"""A policy's timeout in a range going below 0 (a game's [-64, 16]) under ``lowest``: a loss, never better."""


@pytest.mark.parametrize(
    ("setting", "reward_range", "expected"),
    [
        *((setting, None, expected) for setting, expected in BY_SETTING),
        (None, [-64, 16], LOW),
        ("lowest", [-64, 16], LOW),
        ("zero", [-64, 16], POLICY),  # 0 beats losing: the policy would learn to stall
    ],
)
async def test_a_tool_call_running_past_the_deadline_is_the_policys(
    chat: ScriptedChat,
    use_settings: UseSettings,
    setting: str | None,
    reward_range: list[int] | None,
    expected: Any,
) -> None:
    use_settings(NEMO_GYM_TIMEOUT_REWARD=setting)
    script = f"longtool{setting}{'below0' if reward_range else ''}"
    chat.script(script, Turn(tool_calls=(tool("echo"),)), Turn(content="done"))
    async with fake_resources(stall=frozenset({"echo"})) as fake:
        ranged = {"reward_range": reward_range} if reward_range else {}
        envs(use_settings, **{ENV: {"url": fake.url, **ranged}})
        out, _ = await within(10, run_env(chat, env_row(ENV, script), session=script))
        assert fake.stalled.is_set() and fake.verified == []
    assert masked(out) == expected
    assert (out["nemogym"]["turns"], out["nemogym"]["tool_calls"]) == (1, 0)


async def test_a_later_model_call_past_the_deadline_is_the_policys(
    chat: ScriptedChat, use_settings: UseSettings
) -> None:
    chat.script("slowsecond", Turn(tool_calls=(tool("echo"),)), Turn(content="x", delay_s=3600))
    async with fake_resources() as fake:
        out, _ = await within(10, episode(use_settings, chat, fake.url, "slowsecond"))
    assert masked(out) == POLICY
    assert len(fake.tool_calls) == 1 and fake.verified == []


@pytest.mark.parametrize("endpoint", ["seed_session", "verify"])
async def test_a_seed_or_verify_never_answered_is_set_aside(
    chat: ScriptedChat, use_settings: UseSettings, endpoint: str
) -> None:
    chat.script(f"stall{endpoint}", Turn(content="B"))
    async with fake_resources(stall=frozenset({endpoint})) as fake:
        out, _ = await within(10, episode(use_settings, chat, fake.url, f"stall{endpoint}"))
        assert fake.stalled.is_set()
    assert masked(out) == SET_ASIDE
    assert f"/{endpoint}" in out["nemogym"]["failure_reason"]


async def test_a_first_model_call_never_answered_is_set_aside(chat: ScriptedChat, use_settings: UseSettings) -> None:
    """No turn was made: nothing of the policy's to grade (and nothing Miles could train)."""
    chat.script("nofirst", Turn(content="x", delay_s=3600))
    async with fake_resources() as fake:
        out, _ = await within(10, episode(use_settings, chat, fake.url, "nofirst"))
    assert masked(out) == SET_ASIDE


# --- the hooks read a timed-out record as trained with reward 0 ---------------------------------


async def test_the_hooks_train_a_policy_timeout_with_reward_0_and_count_it_by_its_status(
    use_settings: UseSettings, sympy_row: dict[str, Any]
) -> None:
    async with stalling_server("held", calls=1) as server:
        out = await run_row(use_settings, "swe", server.url, sympy_row, server.session_url)
    timed_out = Sample(metadata={**sympy_row, **out})
    assert await agent.reward_func(None, timed_out) == 0.0 and not current().reward_problems
    tally = current().ledger.drain()
    assert (tally.episodes, dict(tally.failures)) == (1, {})  # valid: not a failure
    logged = metrics.rollout_metrics([timed_out], tally)
    assert logged["nemogym/failure_rate"] == 0.0
    assert logged["nemogym/status_rate/miles_nemogym_policy_timeout"] == 1.0
    # Valid in its group, and held for a sample Miles may return ABORTED (no turn reached the session).
    assert groups.group_verdict([timed_out, timed_out], min_valid=2) == (None, False)
    assert current().held.claim(sympy_row["instance_id"]) is not None
