"""Running environment episodes through ``agent.run`` as Miles calls it: a row marked with its
environment, ``NEMO_GYM_ENVS`` naming the stand-in servers, the sample's session URL on the
scripted policy, and the episode store read back."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.agent_fixtures import call
from tests.support.fake_resources import row
from tests.support.runtime_settings import UseSettings
from tests.support.scripted_chat import ScriptedChat, Turn, tag, tool

MILES_KEYS = {"max_seq_len": 4096, "session_server_id": "127.0.0.1:39999", "session_server_instance_id": "i-1"}
"""The bookkeeping keys Miles adds to every sample's metadata."""

_T = TypeVar("_T")


@pytest.fixture(scope="module")
def chat() -> Iterator[ScriptedChat]:
    """One scripted policy for a test module's episodes, with the scripts ``env_row`` names by
    default: ``gold`` (one ``echo`` tool call, then an answer), ``plain`` (an answer, no tool),
    ``unrouted`` and ``unseeded`` (one word: for rows that never reach the policy). A module
    scripts its own tags, or replaces these, with ``chat.script``."""
    with ScriptedChat() as policy:
        policy.script("gold", Turn(content="<think>t</think>", tool_calls=(tool("echo", a=1),)), Turn(content="done"))
        policy.script("plain", Turn(content="\\boxed{B}"))
        policy.script("unrouted", Turn(content="x"))
        policy.script("unseeded", Turn(content="x"))
        yield policy


def masked(out: dict[str, Any]) -> tuple[bool, float, str | None]:
    """(masked, reward trained on, failure kind) of what ``agent.run`` returned."""
    return out["nemogym"]["mask_sample"], out["reward"], out["nemogym"]["failure_kind"]


def env_row(env: str, script: str = "gold", task: str = "1", **fields: Any) -> dict[str, Any]:
    """A row as ``convert`` writes it: the NeMo-Gym task row, marked with its environment and task id."""
    return {**row(tag(script), expected_answer="B"), "nemogym_env": env, "nemogym_task_id": f"{env}/{task}", **fields}


def envs(use_settings: UseSettings, **servers: Any) -> None:
    """``NEMO_GYM_ENVS`` naming ``servers`` (environment -> URL or ``{"url", "max_steps"}``): a new runtime."""
    use_settings(NEMO_GYM_ENVS=json.dumps(servers))


async def run_env(chat: ScriptedChat, metadata: dict[str, Any], session: str = "s") -> dict[str, Any]:
    """``agent.run`` for one sample whose policy is ``chat``, at Miles' session URL ``session``."""
    return await call({**metadata, **MILES_KEYS}, base_url=chat.session_url(session))


ENV = "fake"
"""The environment ``episode`` names for the stand-in resources server."""


async def episode(
    use_settings: UseSettings,
    chat: ScriptedChat,
    url: str,
    script: str,
    *,
    max_steps: int | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """One episode of script ``script`` against the resources server at ``url`` (environment
    ``ENV``, with ``max_steps`` when given), ``fields`` added to its row: what ``agent.run`` returned."""
    envs(use_settings, **{ENV: url if max_steps is None else {"url": url, "max_steps": max_steps}})
    return await run_env(chat, env_row(ENV, script, **fields), session=script)


async def within(seconds: float, awaitable: Awaitable[_T]) -> tuple[_T, float]:
    """(what ``awaitable`` gave, the seconds it took); the test fails when it takes longer than
    ``seconds`` (an episode that never ends fails its test instead of hanging it)."""
    started = time.monotonic()
    try:
        out = await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError:
        pytest.fail(f"did not return within {seconds:g} s")
    return out, time.monotonic() - started


def flush_store(directory: Path) -> None:
    """Wait until the episode store at ``directory`` has written what it was given."""
    from miles_nemogym.runtime import current

    current().stores.get(str(directory)).flush()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json_problem(value: Any) -> str | None:
    """Why ``value`` (a returned dict) is not strict JSON (NaN, Infinity), or None."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError as error:
        return str(error)
    return None


def store_lines(directory: Path) -> list[bytes]:
    """Every line of every file the episode store at ``directory`` wrote (gzip files decoded)."""
    lines: list[bytes] = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        lines += (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).splitlines()
    return lines


def strict_line_problem(line: bytes) -> str | None:
    """Why one store line is not strict JSON (``NaN``, ``Infinity`` or not JSON at all), or None."""
    try:
        json.loads(line, parse_constant=_refuse_constant)
    except ValueError as error:
        return str(error)
    return None


async def in_process_answer_to(use_settings: UseSettings, status: int, body: bytes) -> dict[str, Any]:
    """The record ``agent.run`` returns for an in-process episode whose session answers its second
    model call with ``status`` and ``body`` (the first calls a tool)."""
    from tests.support.fake_resources import fake_resources
    from tests.support.scripted_chat import Turn, tool

    with ScriptedChat() as policy:
        policy.script("answer", Turn(tool_calls=(tool("echo"),)), Turn(status=status, raw=body))
        async with fake_resources() as fake:
            out = await episode(use_settings, policy, fake.url, "answer")
    record: dict[str, Any] = out["nemogym"]
    return record
