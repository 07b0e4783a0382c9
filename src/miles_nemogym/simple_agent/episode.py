"""One ``simple_agent``-style episode against a resources server and the sample's policy URL.

seed -> up to ``max_steps`` chat turns, each tool call POSTed to the resources server ->
verify. The semantics are those of NeMo-Gym 0.7.0's ``responses_api_agents/simple_agent/app.py``
(``_create_episode`` and ``run``): tool arguments that are not JSON and tool answers of any
HTTP status are model-visible tool outputs; the episode stops when a turn calls no tool, when
the model is cut off (``finish_reason == "length"``, its tool calls not run) or after
``max_steps`` turns. Infrastructure failures (seed, verify, the policy endpoint, a dropped
connection) end the episode masked, under a failure kind; they are never a reward.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import pydantic_core
from pydantic import ValidationError

from miles_nemogym import failure_kinds as fk
from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.simple_agent import chat_request
from miles_nemogym.simple_agent.connections import Answer, Connections, TransportFailure, post
from miles_nemogym.simple_agent.transcript import Transcript
from miles_nemogym.simple_agent.wire import AssistantMessage, ChatCompletion, Choice, ToolCall, VerifyAnswer

logger = logging.getLogger(__name__)

NO_TOOL_CALL = "no_tool_call"
LENGTH = "length"
MAX_STEPS = "max_steps"
FAILED = "failed"

_SEED = "seed_session"

# What a 400 from an OpenAI-compatible engine says when the prompt leaves no room to generate
# (the markers vllm_model checks, responses_api_models/vllm_model/app.py).
_CONTEXT_FULL = (b"context length", b"max_tokens")


@dataclass(frozen=True)
class Limits:
    """Per-episode limits. ``max_steps`` None means no limit (``simple_agent``'s default)."""

    max_steps: int | None = None
    max_tool_output_bytes: int = 64 * 1024
    """A longer tool answer is cut here and a note appended (``simple_agent`` has no cap)."""
    max_answer_bytes: int = 64 * 1024 * 1024
    """Cap on a seed, verify or chat answer; a longer one is an infrastructure failure."""
    resources_timeout_s: float | None = 600.0
    """Per seed, tool or verify request."""
    connect_timeout_s: float | None = 10.0
    """To open a connection to the resources server; past it the request was not delivered."""
    policy_timeout_s: float | None = None
    """Per chat-completions request (Miles bounds generation itself)."""


@dataclass
class EpisodeResult:
    """What one episode produced. ``reward`` is None exactly when ``mask_sample``."""

    reward: float | None
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None
    stop: str = FAILED
    """``no_tool_call``, ``length``, ``max_steps``, or ``failed`` (the episode did not reach verify)."""
    turns: int = 0
    tool_calls: int = 0
    total_tool_time: float = 0.0
    """Seconds spent in seed, tool and verify requests (Miles' ``non_generation_time``)."""
    verify: dict[str, Any] | None = field(default=None, repr=False)
    """The ``/verify`` answer as JSON (the row, the ``response`` sent and the environment's fields)."""
    undelivered: bool = False
    """The episode failed because ``/seed_session`` could not be delivered (no connection to the
    resources server): nothing reached any server, so it may be run again once the server is back."""


class _Failed(MilesNemoGymError):
    """An infrastructure failure that ends the episode with ``kind`` (caught in ``run_episode``)."""

    def __init__(self, kind: str, reason: str, *, undelivered: bool = False) -> None:
        super().__init__(reason)
        self.kind = kind
        self.undelivered = undelivered


def _json(data: Any) -> bytes:
    return pydantic_core.to_json(data)


def _describe(answer: Answer, what: str) -> str:
    text = answer.body[:300].decode("utf-8", errors="replace")
    return f"{what} answered HTTP {answer.status}: {text!r}"


def _tool_output(answer: Answer, cap: int) -> str:
    text = answer.body.decode("utf-8", errors="ignore" if answer.truncated else "replace")
    if answer.truncated:
        total = f"{answer.content_length} bytes" if answer.content_length else "more"
        text += f"\n[tool output truncated to its first {cap} bytes of {total}]"
    return text


class _Episode:
    def __init__(
        self,
        row: Mapping[str, Any],
        resources_url: str,
        chat_url: str,
        headers: dict[str, str],
        limits: Limits,
        connections: Connections,
    ) -> None:
        self.row = row
        self.resources_url = resources_url.rstrip("/")
        self.chat_url = chat_url
        self.headers = headers
        self.limits = limits
        self.connections = connections
        self.tool_time = 0.0

    async def _resources(self, session: aiohttp.ClientSession, path: str, body: Any, cap: int) -> Answer:
        started = time.monotonic()
        try:
            return await post(
                session,
                f"{self.resources_url}/{path}",
                data=_json(body),
                cap=cap,
                timeout=self.limits.resources_timeout_s,
                connect_timeout=self.limits.connect_timeout_s,
            )
        except TransportFailure as failure:
            # Only a seed that never left may be sent again: a tool call or verify belongs to
            # an episode the server has already started.
            undelivered = failure.undelivered and path == _SEED
            raise _Failed(failure.kind, str(failure), undelivered=undelivered) from None
        finally:
            self.tool_time += time.monotonic() - started

    async def _seed(self, session: aiohttp.ClientSession) -> None:
        answer = await self._resources(session, _SEED, self.row, self.limits.max_answer_bytes)
        if answer.status >= 300:
            raise _Failed(fk.SEED_FAILED, _describe(answer, "/seed_session"))
        try:
            parsed = json.loads(answer.body) if not answer.truncated else None
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise _Failed(
                fk.SEED_FAILED, f"/seed_session answered a body that is not a JSON object: {answer.body[:200]!r}"
            )

    async def _chat(self, body: dict[str, Any]) -> ChatCompletion:
        try:
            answer = await post(
                self.connections.policy,
                self.chat_url,
                data=_json(body),
                cap=self.limits.max_answer_bytes,
                timeout=self.limits.policy_timeout_s,
                headers=self.headers,
            )
        except TransportFailure as failure:
            raise _Failed(fk.POLICY_FAILED, str(failure)) from None
        if answer.status == 400 and any(marker in answer.body for marker in _CONTEXT_FULL):
            # The conversation outgrew the context: a cut-off, as NeMo-Gym's vllm_model
            # answers it (an empty completion with finish_reason "length").
            return ChatCompletion(choices=[Choice(message=AssistantMessage(content=""), finish_reason="length")])
        if answer.status >= 300 or answer.truncated:
            raise _Failed(fk.POLICY_FAILED, _describe(answer, "the policy"))
        try:
            return ChatCompletion.model_validate_json(answer.body)
        except ValidationError as error:
            raise _Failed(fk.POLICY_FAILED, f"the policy answered an unreadable chat completion: {error}") from None

    async def _call_tool(self, session: aiohttp.ClientSession, call: ToolCall) -> str:
        try:
            arguments = json.loads(call.function.arguments)
        except (ValueError, TypeError) as error:
            return json.dumps({"error": f"Invalid tool call arguments: {error!r}"})
        cap = self.limits.max_tool_output_bytes
        answer = await self._resources(session, quote(call.function.name, safe=""), arguments, cap)
        return _tool_output(answer, cap)

    async def _verify(
        self, session: aiohttp.ClientSession, response: dict[str, Any]
    ) -> tuple[VerifyAnswer, dict[str, Any]]:
        answer = await self._resources(
            session, "verify", {**self.row, "response": response}, self.limits.max_answer_bytes
        )
        if answer.status >= 300:
            raise _Failed(fk.VERIFIER_ERROR, _describe(answer, "/verify"))
        try:
            if answer.truncated:
                raise ValueError(f"longer than {self.limits.max_answer_bytes} bytes")
            raw = json.loads(answer.body)
            return VerifyAnswer.model_validate(raw), raw
        except (ValueError, ValidationError) as error:
            raise _Failed(fk.VERIFIER_ERROR, f"/verify answered no finite reward: {error}") from None

    async def run(self, result: EpisodeResult, transcript: Transcript, first_body: dict[str, Any]) -> None:
        params = self.row["responses_create_params"]
        async with self.connections.episode() as session:
            await self._seed(session)
            step = 0
            while True:
                step += 1
                completion = await self._chat({**first_body, "messages": transcript.messages})
                choice = completion.choices[0]
                if choice.finish_reason == "abort":
                    raise _Failed(fk.CANCELLED, "the policy aborted the generation")
                transcript.add_turn(choice.message, completion.model)
                if choice.finish_reason == "length":
                    result.stop = LENGTH
                    break
                calls = choice.message.tool_calls or []
                if not calls:
                    result.stop = NO_TOOL_CALL
                    break
                for call in calls:
                    transcript.add_tool_output(call.id, await self._call_tool(session, call))
                if self.limits.max_steps and step >= self.limits.max_steps:
                    result.stop = MAX_STEPS
                    break
            response = transcript.response(params, cut_off=result.stop == LENGTH)
            verified, raw = await self._verify(session, response)
        result.verify = raw
        if verified.mask_sample:
            kind = (
                verified.failure_kind if verified.failure_kind and fk.check_server_kind(verified.failure_kind) else None
            )
            raise _Failed(kind or fk.VERIFIER_ERROR, verified.failure_reason or "/verify masked the sample")
        result.reward = verified.reward
        result.failure_kind = verified.failure_kind


async def run_episode(
    row: Mapping[str, Any],
    *,
    session_url: str,
    resources_url: str,
    request_kwargs: Mapping[str, Any] | None = None,
    limits: Limits | None = None,
    api_key: str | None = None,
    connections: Connections | None = None,
) -> EpisodeResult:
    """Run one episode of ``row`` (a NeMo-Gym task row with ``responses_create_params``).

    ``session_url`` is Miles' per-sample base URL (chat at ``<session_url>/v1/chat/completions``),
    ``resources_url`` the environment's resources server, ``request_kwargs`` Miles' sampling keys.
    Never raises for an episode failure (the result is masked with a kind); cancellation propagates.
    """
    limits = limits or Limits()
    result = EpisodeResult(reward=None)
    try:
        params = row.get("responses_create_params")
        if not isinstance(params, Mapping):
            raise chat_request.RowError("the task row has no responses_create_params object")
        transcript = Transcript(chat_request.messages(params))
        first_body = chat_request.request_body(params, request_kwargs)
    except chat_request.RowError as error:
        return _masked(result, fk.INVALID_REQUEST, str(error))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    chat_url = f"{session_url.rstrip('/')}/v1/chat/completions"
    owned = connections is None
    pool = connections or await Connections().__aenter__()
    episode = _Episode(row, resources_url, chat_url, headers, limits, pool)
    try:
        await episode.run(result, transcript, first_body)
    except _Failed as failure:
        _masked(result, failure.kind, str(failure))
        result.undelivered = failure.undelivered
    except pydantic_core.PydanticSerializationError as error:
        _masked(result, fk.INVALID_REQUEST, f"the task row cannot be sent as JSON: {error}")
    except Exception as error:  # a defect here: recorded, never a reward, never raised into Miles
        logger.exception("simple_agent episode failed on a defect")
        _masked(result, fk.CLIENT_ERROR, f"{type(error).__name__}: {error}")
    finally:
        result.turns, result.tool_calls = transcript.turns, transcript.tool_calls
        result.total_tool_time = episode.tool_time
        if owned:
            await pool.close()
    return result


def _masked(result: EpisodeResult, kind: str, reason: str) -> EpisodeResult:
    result.reward = None
    result.mask_sample = True
    result.failure_kind = kind
    result.failure_reason = reason
    return result
