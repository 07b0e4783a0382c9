"""A scripted, recording OpenAI-compatible policy served at Miles' session URL shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["RecordingPolicy"]

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_LOOK_AROUND = ("pwd", "ls -la")

_SCRIPTED_PATCH_FILE = "miles_nemogym_scripted.txt"
SCRIPTED_PATCH = (
    f"diff --git a/{_SCRIPTED_PATCH_FILE} b/{_SCRIPTED_PATCH_FILE}\n"
    "new file mode 100644\n"
    "--- /dev/null\n"
    f"+++ b/{_SCRIPTED_PATCH_FILE}\n"
    "@@ -0,0 +1 @@\n"
    "+written by the miles-nemogym scripted policy\n"
)
"""Adds one file, so it applies to any repository: ``git diff`` of a policy that only looks around submits nothing."""

# Must exit 0: mini-swe-agent only accepts a submission from a successful command.
_SUBMIT_COMMAND = f"echo {SUBMIT_MARKER}; cat <<'MILES_NEMOGYM_PATCH'\n{SCRIPTED_PATCH}MILES_NEMOGYM_PATCH"


@dataclass(frozen=True)
class RecordedRequest:
    """One request the policy received: ``body`` parsed as JSON (else its text), ``Authorization`` apart."""

    session_id: str | None
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    authorization: str | None = field(default=None, repr=False)  # a secret: never printed by repr


@dataclass(frozen=True)
class Answer:
    """One scripted assistant turn: text and/or tool calls ``(name, arguments)``."""

    content: str | None = None
    tool_calls: tuple[tuple[str, Mapping[str, Any]], ...] = ()


FINAL_ANSWER = Answer(content="Done.")  # said once a session's answers are played: no tool call ends the loop


@dataclass(frozen=True)
class Script:
    """How the policy answers in one session."""

    look_around_turns: int = 2
    answers: tuple[Answer, ...] = ()  # turns to play instead of the bash script (then FINAL_ANSWER)

    def command_for_turn(self, turn: int) -> str:
        return _LOOK_AROUND[turn % len(_LOOK_AROUND)] if turn < self.look_around_turns else _SUBMIT_COMMAND


def _estimate_tokens(value: Any) -> int:
    """A rough, deterministic token count (4 characters per token) for ``usage``."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return max(1, len(text) // 4)


def _tool_name_and_argument(body: Mapping[str, Any]) -> tuple[str, str]:
    """The bash tool's name and its command argument, as the request declared them."""
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        parameters = function.get("parameters") or {}
        required = parameters.get("required") or list((parameters.get("properties") or {}).keys())
        if required:
            return str(function.get("name", "bash")), str(required[0])
    return "bash", "command"


def thought(turn: int) -> str:
    """The assistant text before each scripted tool call."""
    return f"THOUGHT: step {turn + 1} of the scripted policy."


def _completion(body: Mapping[str, Any], answer: Answer) -> dict[str, Any]:
    """An OpenAI chat.completion saying ``answer``, its usage estimated."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(dict(arguments))}}
            for name, arguments in answer.tool_calls
        ]  # fmt: skip
    prompt_tokens = _estimate_tokens(body.get("messages", []))
    completion_tokens = _estimate_tokens(message.get("content") or "") + sum(
        _estimate_tokens(call["function"]) for call in message.get("tool_calls", [])
    )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(body.get("model", "policy")),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _error(status: int, message: str) -> web.Response:
    payload = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return web.json_response(payload, status=status)


class RecordingPolicy:
    """The loopback policy server. ``session_url()`` gives Miles' ``base_url`` shape."""

    def __init__(
        self,
        *,
        look_around_turns: int = 2,
        host: str = "127.0.0.1",
        port: int = 0,
        on_request: Callable[[RecordedRequest], None] | None = None,
    ) -> None:
        if look_around_turns < 0:
            raise ValueError(f"look_around_turns must be >= 0, got {look_around_turns}")
        self.default_script = Script(look_around_turns=look_around_turns)
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._on_request = on_request  # called in the server's event loop
        self._scripts: dict[str, Script] = {}
        self._records: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("the recording policy is not started")
        return f"http://{self.host}:{self._port}"

    def session_url(self, session_id: str | None = None, **script: Any) -> str:
        """Miles' ``base_url`` for a session (no ``/v1``; a new id when none is given), ``script`` its changes."""
        sid = session_id or uuid.uuid4().hex
        if "/" in sid:
            raise ValueError(f"session id must not contain '/': {sid!r}")
        if script:
            self.configure_session(sid, **script)
        return f"{self.url}/sessions/{sid}"

    @staticmethod
    def session_id_of(session_url: str) -> str:
        return session_url.rstrip("/").removesuffix("/v1").rsplit("/sessions/", 1)[1]

    def configure_session(self, session_id: str, **changes: Any) -> None:
        """Change one session's script, e.g. ``configure_session(sid, look_around_turns=0)``."""
        with self._lock:
            current = self._scripts.get(session_id, self.default_script)
            self._scripts[session_id] = Script(**{**current.__dict__, **changes})

    def requests(self, session_id: str | None = None) -> list[RecordedRequest]:
        """Recorded requests (all, or one session's), in arrival order."""
        with self._lock:
            return [r for r in self._records if session_id is None or r.session_id == session_id]

    def chat_requests(self, session_id: str) -> list[RecordedRequest]:
        return [r for r in self.requests(session_id) if r.method == "POST" and r.path.endswith("/v1/chat/completions")]

    async def _record(self, request: web.Request) -> RecordedRequest:
        text = await request.text()
        body: Any = text
        with contextlib.suppress(json.JSONDecodeError):
            body = json.loads(text) if text else None
        record = RecordedRequest(
            session_id=request.match_info.get("session_id"),
            method=request.method,
            path=request.path,
            headers={k: v for k, v in request.headers.items() if k.lower() != "authorization"},
            body=body,
            authorization=request.headers.get("Authorization"),
        )
        with self._lock:
            self._records.append(record)
        if self._on_request is not None:
            self._on_request(record)
        return record

    async def _chat(self, request: web.Request) -> web.Response:
        record = await self._record(request)
        body, sid = record.body, record.session_id or ""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "body must be a JSON object with a `messages` list")
        if body.get("stream"):
            return _error(400, "the recording policy does not stream; the harness never asks to")
        turn = len(self.chat_requests(sid)) - 1
        with self._lock:
            script = self._scripts.get(sid, self.default_script)
        if script.answers:
            answer = script.answers[turn] if turn < len(script.answers) else FINAL_ANSWER
        else:  # one bash tool call running the script's command
            name, argument = _tool_name_and_argument(body)
            answer = Answer(content=thought(turn), tool_calls=((name, {argument: script.command_for_turn(turn)}),))
        return web.json_response(_completion(body, answer))

    async def _other(self, request: web.Request) -> web.Response:
        await self._record(request)
        served = "POST /sessions/<id>/v1/chat/completions"
        return _error(404, f"the recording policy serves only {served}, not {request.method} {request.path}")

    async def start(self) -> RecordingPolicy:
        if self._runner is not None:
            raise RuntimeError("the recording policy is already started")
        app = web.Application()
        app.router.add_post("/sessions/{session_id}/v1/chat/completions", self._chat)
        app.router.add_route("*", "/sessions/{session_id}/{tail:.*}", self._other)
        app.router.add_route("*", "/{tail:.*}", self._other)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.host, self._requested_port).start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> RecordingPolicy:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    def __enter__(self) -> RecordingPolicy:
        """Serve from a background thread with its own event loop (for sync callers)."""
        self._loop = loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="recording-policy", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(30.0)
        except BaseException as error:
            self.__exit__()
            if isinstance(error, TimeoutError):
                raise RuntimeError("the recording policy did not start in time") from None
            raise
        return self

    def __exit__(self, *_: object) -> None:
        if self._thread is None or self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop(), self._loop).result(30.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30.0)
        self._loop.close()
        self._thread = None
