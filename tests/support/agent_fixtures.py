"""Fixtures for driving ``agent.run`` against a loopback fault server.

Import the fixtures by name into a test module (pytest finds them in its namespace).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from miles_nemogym import agent, runtime, transport
from miles_nemogym.episode.record import ENV_KEY, TASK_ID_KEY
from miles_nemogym.settings import Settings
from tests.support.fault_server import EARLY_ERRORS, FaultServer
from tests.support.runtime_settings import UseSettings
from tests.support.samples import Sample, Status

SESSION = "http://127.0.0.1:39999/sessions/s-1"
ROLLOUT_SECRET = "test-rollout-secret-0123456789abcdef"
"""What ``serve`` would print as ``NEMO_GYM_ROLLOUT_SECRET`` (agent rows sign their rollout ids with it)."""


AGENT_ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Deal me in."}]},
    "agent_ref": {"type": "responses_api_agents", "name": "blackjack_gymnasium_agent"},
    ENV_KEY: "blackjack",
    TASK_ID_KEY: "blackjack/0",
}
"""A blackjack agent row as ``convert`` writes it: its agent server plays it through ``/run``."""
AGENT_OUTPUT = [
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "<action>hit</action>"}]},
    {"type": "message", "role": "user", "content": "Your hand: [9, 5, 4] = 18"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "<action>stand</action>"}]},
]


def agent_answer(**fields: Any) -> Callable[[dict[str, Any]], web.Response]:
    """An agent server's ``/run`` answer to ``AGENT_ROW`` (two turns) with ``fields`` (reward, ...)."""
    body = {
        "responses_create_params": AGENT_ROW["responses_create_params"],
        "response": {"output": AGENT_OUTPUT},
        **fields,
    }
    return lambda request: web.json_response(body)


@pytest.fixture
def fast_env(use_settings: UseSettings) -> None:
    """A short connect timeout and serve's rollout secret, nothing from the shell: each test sets what it needs."""
    use_settings(NEMO_GYM_CONNECT_TIMEOUT="2", NEMO_GYM_ROLLOUT_SECRET=ROLLOUT_SECRET)


@pytest.fixture
def quick_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The outage probe's backoff capped at 0.2 s (0.5 s shipped): a server that is back is seen sooner."""
    monkeypatch.setattr(runtime, "_PROBE_BACKOFF_MAX_S", 0.2)


@pytest.fixture
def distinct_rows(gym_example_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Six of the wheel's rows (repeating), each with an instance id of its own (task-0 ... task-5)."""
    return [dict(gym_example_rows[i % len(gym_example_rows)], instance_id=f"task-{i}") for i in range(6)]


@pytest.fixture
async def server(sympy_result: dict[str, Any], use_settings: UseSettings, fast_env: None) -> AsyncIterator[FaultServer]:
    srv = await FaultServer(result=sympy_result).start()
    use_settings(NEMO_GYM_URL=srv.url)
    yield srv
    await transport.close_pools()
    await srv.stop()


async def call(metadata: Any, *, settings: Settings | None = None, **kwargs: Any) -> dict[str, Any]:
    """``agent.run`` as Miles calls it, with overridable ``base_url`` and ``request_kwargs``;
    ``settings`` instead of the runtime's (``agent.run_with_settings``)."""
    return await agent.run_with_settings(
        settings,
        base_url=kwargs.pop("base_url", SESSION),
        request_kwargs=kwargs.pop("request_kwargs", {"temperature": 1.0, "top_p": 1.0, "max_tokens": 64}),
        metadata=metadata,
    )


# -- samples as Miles returns them --------------------------------------------------------------

TOKENS = [151644, 872, 198, 9707, 151645]


def input_sample(row: dict[str, Any], index: int, group: int = 0) -> Sample:
    return Sample(prompt=[{"role": "user", "content": "x"}], metadata=dict(row), index=index, group_index=group)


async def episode(server: FaultServer, sample: Sample, mode: str) -> Sample:
    """Run the agent for ``sample`` with the server in ``mode``; the sample as Miles returns it."""
    server.mode = mode
    result = await agent.run(
        base_url="http://127.0.0.1:39999/sessions/s-1",
        prompt=sample.prompt,
        request_kwargs={"max_tokens": 64},
        metadata={**sample.metadata, "session_server_id": "127.0.0.1:39999"},
    )
    if mode in EARLY_ERRORS:  # the server failed before the episode's first model call
        aborted = copy.deepcopy(sample)
        aborted.status = Status.ABORTED
        return aborted
    out = copy.deepcopy(sample)
    out.metadata.update(result)
    out.tokens, out.response_length, out.loss_mask = list(TOKENS), 2, [1, 1]
    out.rollout_log_probs, out.reward = [-0.5, -0.25], float(result["reward"])
    return out
