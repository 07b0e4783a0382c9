"""The environment episode: NeMo-Gym 0.7.0's ``simple_agent`` loop (seed, chat turns and tool calls,
verify) run here against a ``NEMO_GYM_ENVS`` resources server, model calls to the sample's Miles
session. Each rule: docs/environments.md ("One episode")."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from miles_nemogym.episode.record import (
    Outcome,
    Task,
    failure_of,
    finite_json,
    judge,
    range_setting,
    row_extra_body,
    shown,
    task_row,
)
from miles_nemogym.errors import (
    AGENT_TIMEOUT,
    CANCELLED,
    POLICY_FAILED,
    SEED_FAILED,
    VERIFIER_ERROR,
    Failed,
    RequestError,
)
from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import CONTEXT_FULL
from miles_nemogym.settings import EnvironmentServer, Settings
from miles_nemogym.transport import Answer, Deadline, check_session_url, pool, request

__all__ = ["first_request"]

_PARAMS = "responses_create_params"
_TOOL_OUTPUT_BYTES = 64 * 1024  # a longer tool answer is cut here, with a note (simple_agent has no cap)
# The resources server's own endpoints: never a tool.
_RESOURCES_ROUTES = frozenset({"seed_session", "verify", "close_session", "aggregate_metrics", "reverify_mode"})
# /verify's answer echoes the request; these are the loop's own fields, not the environment's.
_VERIFY_OWN = frozenset({"response", "reward", "mask_sample", "failure_kind", "failure_reason"})


# -- the first request: the task row as a chat-completions request, as NeMo-Gym's converter makes it

_NOT_RENDERED = frozenset({"type", "defer_loading", "strict"})  # tool keys the function does not get
_ROW_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens"}
_AUDIO = ("audio_data", "audio_path", "audio_paths")  # metadata keys vllm_model adds as audio: not sent


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for index, part in enumerate(content):
            if isinstance(part, Mapping) and part.get("type") in ("input_text", "output_text", "text"):
                parts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise RequestError(f"{where}[{index}] is a {shown(kind)} part; only text parts are supported")
        return "".join(parts)
    raise RequestError(f"{where} must be a string or a list of text parts, got {type(content).__name__}")


def _messages(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = params.get("input", [])
    items: list[Any] = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    if not isinstance(items, list):
        raise RequestError(f"{_PARAMS}.input must be a string or a list of messages")
    out: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        where = f"{_PARAMS}.input[{index}]"
        if not isinstance(item, Mapping) or item.get("type", "message") != "message" or "role" not in item:
            raise RequestError(f"{where} must be a message {{role, content}}; other input item types are not supported")
        out.append({"role": str(item["role"]), "content": _text(item.get("content", ""), f"{where}.content")})
    instructions = params.get("instructions")
    if instructions:
        leading = [str(instructions)]
        while out and out[0]["role"] in ("system", "developer"):
            leading.append(out.pop(0)["content"])
        out.insert(0, {"role": "system", "content": "\n\n".join(leading)})
    return out


def _tools(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = params.get("tools") or []
    if not isinstance(raw, list):
        raise RequestError(f"{_PARAMS}.tools must be a list")
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(raw):
        name = tool.get("name") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(name, str):
            raise RequestError(f"{_PARAMS}.tools[{index}] must be a function tool {{type: 'function', name, ...}}")
        if name in _RESOURCES_ROUTES or not name.strip(".") or "/" in name:
            raise RequestError(
                f"{_PARAMS}.tools[{index}].name {shown(name)} names no tool a resources server can serve "
                f"(it is empty, a path, or one of its own endpoints: {', '.join(sorted(_RESOURCES_ROUTES))})"
            )
        function = {k: v for k, v in tool.items() if k not in _NOT_RENDERED and v is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    """A Responses ``tool_choice`` as chat-completions spells it: a named tool moves under ``function``."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise RequestError(f"{_PARAMS}.tool_choice must be a string or {{type: 'function', name}}, got {shown(choice)}")


def _format_and_reasoning(params: Mapping[str, Any]) -> dict[str, Any]:
    """The chat keys NeMo-Gym's converter makes of ``text.format`` and ``reasoning`` (or refuses, as it does)."""
    reasoning = params.get("reasoning") or {}
    if not isinstance(reasoning, Mapping):
        raise RequestError(f"{_PARAMS}.reasoning must be an object")
    unsent = sorted(key for key, value in reasoning.items() if key != "effort" and value is not None)
    if unsent:
        raise RequestError(f"{_PARAMS}.reasoning.{unsent[0]} has no chat-completions form: remove it from the row")
    effort = {"reasoning_effort": reasoning["effort"]} if reasoning.get("effort") is not None else {}
    text = params.get("text") or {}
    text_format = (text.get("format") if isinstance(text, Mapping) else None) or {"type": "text"}
    kind = text_format.get("type") if isinstance(text_format, Mapping) else None
    if kind == "json_schema" and "name" in text_format and "schema" in text_format:
        schema = {
            k: text_format[k] for k in ("name", "schema", "strict", "description") if text_format.get(k) is not None
        }
        return {"response_format": {"type": "json_schema", "json_schema": schema}, **effort}
    if kind in ("json_object", "text"):
        return {"response_format": {"type": "json_object"}, **effort} if kind == "json_object" else effort
    raise RequestError(
        f"{_PARAMS}.text.format must be {{type: 'text'}}, {{type: 'json_object'}} or "
        f"{{type: 'json_schema', name, schema}}, got {shown(text_format)}"
    )


def first_request(
    params: Mapping[str, Any], request_kwargs: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the chat messages, the first chat-completions body without them); ``RequestError`` names a bad field."""
    messages = _messages(params)
    metadata = params.get("metadata") or {}
    audio = [key for key in _AUDIO if metadata.get(key)]
    if audio:
        raise RequestError(
            f"{_PARAMS}.metadata.{audio[0]} is audio NeMo-Gym's vllm_model adds to the last user message; "
            "the environment loop sends text only: drop the row"
        )
    # The row's extra_body sits under every key the row itself sets, as vllm_model merges it.
    body = row_extra_body(metadata.get("extra_body"), f"{_PARAMS}.metadata.extra_body")
    if metadata.get("chat_template_kwargs"):
        where = f"{_PARAMS}.metadata.chat_template_kwargs"
        body["chat_template_kwargs"] = row_extra_body(metadata["chat_template_kwargs"], where)
    for row_key, chat_key in _ROW_SAMPLING.items():
        if params.get(row_key) is not None:
            body[chat_key] = params[row_key]
    body.update(_format_and_reasoning(params))
    chat_tools = _tools(params)
    tool_choice = _tool_choice(params.get("tool_choice"))
    if chat_tools:
        body["tools"] = chat_tools
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        if params.get("parallel_tool_calls") is not None:
            body["parallel_tool_calls"] = params["parallel_tool_calls"]
    elif tool_choice not in (None, "auto", "none"):
        raise RequestError(f"{_PARAMS}.tool_choice {shown(tool_choice)} needs a tool, and the row offers none")
    body.update({key: value for key, value in (request_kwargs or {}).items() if value is not None})
    body.pop("stream", None)
    return messages, body


@dataclass(frozen=True)
class EnvironmentEpisode:
    """One environment episode, checked before anything is sent (``deliver`` runs it)."""

    environment: str
    server: EnvironmentServer
    row: dict[str, Any]  # the task row as the resources server gets it (record.task_row)
    task_id: str | None
    chat_url: str
    messages: list[dict[str, Any]]
    body: dict[str, Any]  # the first chat-completions body but its messages
    tools: frozenset[str]  # the tools the row offers: the only names the model may call
    settings: Settings
    setting = "NEMO_GYM_ENVS"

    @property
    def server_url(self) -> str:
        return self.server.url

    async def attempt(self, deadline: Deadline) -> Outcome:
        return await _Loop(self, deadline).run()


def prepare(
    task: Task,
    server: EnvironmentServer,
    *,
    session_url: str,
    request_kwargs: Mapping[str, Any] | None,
    settings: Settings,
) -> EnvironmentEpisode:
    """The episode of an environment row for ``server``; ``RequestError`` names what is wrong."""
    row = task_row(task.metadata)
    if request_kwargs is not None and not isinstance(request_kwargs, Mapping):
        raise RequestError(f"request_kwargs must be a dict of sampling parameters, got {type(request_kwargs).__name__}")
    check_session_url(session_url)
    params = row.get(_PARAMS)
    if not isinstance(params, Mapping):
        raise RequestError(f"the task row has no {_PARAMS} object")
    messages, body = first_request(params, request_kwargs)
    try:
        pydantic_core.to_json(row)
    except pydantic_core.PydanticSerializationError as error:
        raise RequestError(f"the task row cannot be sent as JSON: {error}") from None
    return EnvironmentEpisode(
        environment=task.environment,
        server=server,
        row=row,
        task_id=task.task_id,
        chat_url=f"{session_url.strip().rstrip('/')}/v1/chat/completions",
        messages=messages,
        body=body,
        tools=frozenset(tool["function"]["name"] for tool in body.get("tools", [])),
        settings=settings,
    )


class _FunctionCall(BaseModel):
    name: StrictStr
    arguments: StrictStr = ""  # the raw string the model wrote


class _ToolCall(BaseModel):
    id: StrictStr
    type: str = "function"
    function: _FunctionCall


class _Message(BaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # a reasoning parser's thinking (SGLang; vLLM >= 0.16: reasoning)
    reasoning: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(BaseModel):
    message: _Message
    finish_reason: str | None = None


class _ChatCompletion(BaseModel):
    """One non-streamed chat-completions answer (Miles' session server's); ``choices[0]`` is the turn."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    choices: list[_Choice] = Field(min_length=1)


_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
# responses_create_params fields NeMo-Gym copies onto the Response it builds.
_COPIED = ("temperature", "top_p", "max_output_tokens", "instructions", "metadata", "text", "reasoning", "user")


class _Transcript:
    """The conversation twice: the chat history sent back to the policy, the items ``/verify`` reads."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = list(messages)
        self.output: list[dict[str, Any]] = []
        self.turns = 0
        self.tool_calls = 0
        self.model: str | None = None
        self._last_turn_answered = True

    def add_turn(self, message: _Message, model: str | None) -> None:
        entry: dict[str, Any] = {"role": "assistant", "content": message.content}
        for key in ("reasoning_content", "reasoning"):  # back as written: Miles' session matcher compares it
            if getattr(message, key) is not None:
                entry[key] = getattr(message, key)
        if message.tool_calls:
            entry["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        self.messages.append(entry)
        content = message.content or ""
        parsed = message.reasoning_content or message.reasoning
        if parsed:  # vllm_model (uses_reasoning_parser) puts a parser's reasoning back in <think> first
            content = f"<think>{parsed}</think>{content}"
        thoughts = _THINK.findall(content)
        text = _THINK.sub("", content)
        calls = message.tool_calls or []
        if thoughts:
            summary = [{"type": "summary_text", "text": thought} for thought in thoughts]
            self.output.append({"id": _id("rs"), "type": "reasoning", "summary": summary, "status": "completed"})
        if text or not (thoughts or calls):
            self.output.append(
                {
                    "id": _id("msg"),
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        for call in calls:
            self.output.append(
                {
                    "id": call.id,
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.function.name,
                    "arguments": call.function.arguments,
                    "status": "completed",
                }
            )
        self._last_turn_answered = bool(text or calls or not thoughts)
        self.turns += 1
        self.model = model or self.model

    def add_tool_output(self, call_id: str, output: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        self.output.append({"type": "function_call_output", "call_id": call_id, "output": output})
        self.tool_calls += 1

    def response(self, params: Mapping[str, Any], *, cut_off: bool) -> dict[str, Any]:
        """NeMo-Gym's ``NeMoGymResponse``: ``incomplete`` when cut off or (as ``simple_agent``) reasoning-only."""
        thinking_only = not cut_off and not self._last_turn_answered
        response: dict[str, Any] = {
            "id": _id("resp"),
            "object": "response",
            "created_at": float(int(time.time())),
            "model": self.model or params.get("model") or "policy",
            "output": self.output,
            "tools": list(params.get("tools") or []),
            "tool_choice": params.get("tool_choice") or "auto",
            "parallel_tool_calls": params.get("parallel_tool_calls", True),
            "status": "incomplete" if cut_off or thinking_only else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut_off else None,
        }
        response.update({key: params[key] for key in _COPIED if params.get(key) is not None})
        if thinking_only:
            response["metadata"] = {**(response.get("metadata") or {}), "ng_termination_reason": "incomplete_reasoning"}
        return response


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Loop:
    """One try of an episode: seed, turns, verify; its outcome (``Failed`` when the seed never left)."""

    def __init__(self, episode: EnvironmentEpisode, deadline: Deadline) -> None:
        self.episode = episode
        self.settings = episode.settings
        self.deadline = deadline
        self.base = episode.server.url.rstrip("/")
        self.transcript = _Transcript(episode.messages)
        self.tool_time = 0.0
        self.cut_off = False
        self.verified_response: dict[str, Any] | None = None  # what /verify was sent (we keep ours, not its echo)
        key = self.settings.policy_api_key
        self.policy_headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else None

    async def run(self) -> Outcome:
        connections = await pool(self.settings.max_concurrency)
        verify: dict[str, Any] | None = None
        try:
            async with connections.episode() as session:
                await self._seed(session)
                for step in itertools.count(1):
                    choice, model = await self._chat(connections.policy)
                    if choice.finish_reason == "abort":
                        raise Failed(CANCELLED, "the policy aborted the generation", aborted=True)
                    self.transcript.add_turn(choice.message, model)
                    if choice.finish_reason == "length":
                        self.cut_off = True
                        break
                    calls = choice.message.tool_calls or []
                    if not calls:
                        break
                    for call in calls:
                        self.transcript.add_tool_output(call.id, await self._call_tool(session, call))
                    if self.episode.server.max_steps and step >= self.episode.server.max_steps:
                        break
                verify = await self._verify(session)
        except Failed as failed:
            if failed.resendable:
                raise
            lowest = self.episode.server.valid_rewards(self.settings.reward_range)[0]
            outcome = failure_of(failed, self.episode.task_id, self.settings, lowest=lowest)
        else:
            outcome = self._score(verify or {})
        outcome.record.turns, outcome.record.tool_calls = self.transcript.turns, self.transcript.tool_calls
        outcome.tool_time_s = round(self.tool_time, 6)
        # For the store: the verifier's answer with the loop's response, also when it ended before /verify.
        outcome.answer = {**(verify or {}), "response": self.verified_response or self._response()}
        return outcome

    def _response(self) -> dict[str, Any]:
        return self.transcript.response(self.episode.row[_PARAMS], cut_off=self.cut_off)

    async def _post(self, session: Any, path: str, body: Any, cap: int, *, tool: bool = False) -> Answer:
        """POST to the resources server (NaN as null, as NeMo-Gym's orjson); only a seed that never left is
        ``resendable``, and a ``tool`` call's deadline is the policy's."""
        started = time.monotonic()
        try:
            answer = await request(
                session,
                "POST",
                f"{self.base}/{path}",
                payload=pydantic_core.to_json(body, inf_nan_mode="null"),
                deadline=self.deadline,
                connect_timeout_s=self.settings.connect_timeout_s,
                cap=cap,
            )
        except Failed as error:
            resendable = error.resendable and path == "seed_session"
            raise Failed(error.kind, f"/{path}: {error}", resendable=resendable, policy=tool) from None
        finally:
            self.tool_time += time.monotonic() - started
        return self._scrubbed(answer)

    def _scrubbed(self, answer: Answer) -> Answer:
        """``answer`` without the policy key, before anything reads it (a cut key matches no pattern)."""
        scrubber = self.settings.key_scrubber()
        if scrubber is None:
            return answer
        body = scrubber.scrub_cut(answer.body) if answer.over_cap else scrubber.scrub(answer.body)
        return dataclasses.replace(answer, body=body)

    async def _seed(self, session: Any) -> None:
        answer = await self._post(session, "seed_session", self.episode.row, self.settings.max_result_bytes)
        if answer.status != 200 or answer.over_cap or not isinstance(_parsed(answer), dict):
            hint = ""
            if answer.status == 404:  # a gymnasium server (/reset, /step) or another agent's environment
                hint = (
                    f"; if {self.episode.environment!r} is played by another agent than simple_agent (gymnasium_agent, "
                    "...), give its agent server in NEMO_GYM_ENVS (`miles-nemogym serve --env "
                    f'{self.episode.environment}` prints the entry with its "agent")'
                )
            raise Failed(SEED_FAILED, _described(answer, "/seed_session", "a JSON object") + hint)

    async def _chat(self, session: Any) -> tuple[_Choice, str | None]:
        body = {**self.episode.body, "messages": self.transcript.messages}
        try:
            answer = await request(
                session,
                "POST",
                self.episode.chat_url,
                payload=pydantic_core.to_json(body),
                deadline=self.deadline,
                connect_timeout_s=self.settings.connect_timeout_s,
                cap=self.settings.max_result_bytes,
                headers=self.policy_headers,
            )
        except Failed as error:
            kind = AGENT_TIMEOUT if error.kind == AGENT_TIMEOUT else POLICY_FAILED
            # After its first answered turn the episode is the policy's; a first call never answered is not.
            raise Failed(kind, f"the policy: {error.kind}: {error}", policy=self.transcript.turns > 0) from None
        answer = self._scrubbed(answer)
        if answer.status == 400 and not answer.over_cap and CONTEXT_FULL.search(answer.body):
            # The conversation outgrew the context: a cut-off, as NeMo-Gym's vllm_model answers it.
            return _Choice(message=_Message(content=""), finish_reason="length"), None
        if answer.status != 200 or answer.over_cap:
            raise Failed(POLICY_FAILED, _described(answer, "the policy", "a chat completion"))
        try:
            completion = _ChatCompletion.model_validate_json(answer.body)
        except ValueError as error:  # a ValidationError, or JSON nested past pydantic's limit
            raise Failed(POLICY_FAILED, f"the policy answered an unreadable chat completion: {error}") from None
        return completion.choices[0], completion.model

    async def _call_tool(self, session: Any, call: _ToolCall) -> str:
        name = call.function.name
        if name not in self.episode.tools:
            # Only the row's tools are called: never the server's own endpoints, nor a path.
            offered = ", ".join(sorted(self.episode.tools)) or "none"
            return json.dumps({"error": f"Unknown tool {name!r}: this task offers {offered}"})
        try:
            arguments = json.loads(call.function.arguments)
        except (ValueError, TypeError, RecursionError) as error:
            return json.dumps({"error": f"Invalid tool call arguments: {error!r}"})
        answer = await self._post(session, quote(name, safe=""), arguments, _TOOL_OUTPUT_BYTES, tool=True)
        text = answer.body.decode("utf-8", errors="ignore" if answer.over_cap else "replace")
        if answer.over_cap:
            text += f"\n[tool output truncated to its first {_TOOL_OUTPUT_BYTES} bytes of at least {answer.size}]"
        return text

    async def _verify(self, session: Any) -> dict[str, Any]:
        self.verified_response = self._response()
        body = {**self.episode.row, "response": self.verified_response}
        answer = await self._post(session, "verify", body, self.settings.max_result_bytes)
        parsed = _parsed(answer) if answer.status == 200 and not answer.over_cap else None
        if not isinstance(parsed, dict):
            raise Failed(VERIFIER_ERROR, _described(answer, "/verify", "a JSON object"))
        # Our transcript stands for the echoed response: the echo can be large, and it is what we sent.
        return {key: value for key, value in parsed.items() if key != "response"}

    def _score(self, verify: dict[str, Any]) -> Outcome:
        """``judge``'s verdict of the verifier's answer, in the environment's reward range."""
        own = {key: value for key, value in verify.items() if key not in _VERIFY_OWN and key not in self.episode.row}
        server = self.episode.server
        return judge(
            verify,
            reward_range=server.valid_rewards(self.settings.reward_range),
            range_name=range_setting(self.episode.environment, server),
            report=finite_json(own),
            who="/verify",
        )


def _parsed(answer: Answer) -> Any:
    """The answer's JSON, or None (not JSON, or nested past the parser's limit)."""
    try:
        return pydantic_core.from_json(answer.body)
    except ValueError:
        return None


def _described(answer: Answer, what: str, expected: str) -> str:
    if answer.over_cap:
        size = f"at least {answer.size} bytes decoded"
        return f"{what}'s answer exceeds NEMO_GYM_MAX_RESULT_BYTES ({size}); not read further"
    if answer.status != 200:
        where = f" (a redirect to {answer.location}, not followed)" if answer.location else ""
        return f"{what} answered HTTP {answer.status}{where}: {answer.body[:300].decode('utf-8', 'replace')!r}"
    return f"{what} answered a body that is not {expected}: {answer.body[:200]!r}"
