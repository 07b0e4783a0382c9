"""A scripted chat-completions policy on loopback, shared by our loop and NeMo-Gym's.

Both callers reach the same scripts: this package's loop at Miles' session URL shape
(``/sessions/<id>/v1/chat/completions``), NeMo-Gym's ``vllm_model`` server (what
``simple_agent`` calls, ``/v1/responses``) at its configured ``base_url`` (``/v1/chat/completions``).
Neither tells the policy which episode a call belongs to in a common way, so a script is
chosen by a tag ``[script:<name>]`` in the conversation's messages and the turn by the number
of assistant messages already in it. Answers follow the OpenAI chat-completions contract
vLLM serves (``choices[0].message`` with ``content`` and ``tool_calls``, ``finish_reason``).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MAX_REQUESTS = 100
"""Calls one script answers by default; more mean a loop that does not stop."""
_TAG = re.compile(r"\[script:([A-Za-z0-9_.-]+)\]")


@dataclass(frozen=True)
class Turn:
    """One scripted answer. ``tool_calls`` are ``(name, raw arguments)``; ``status``/``raw``
    replace the answer with an HTTP error or a raw body; ``delay_s`` holds it back."""

    content: str | None = None
    tool_calls: tuple[tuple[str, str], ...] = ()
    finish_reason: str | None = None
    status: int = 200
    raw: bytes | None = None
    delay_s: float = 0.0


def tool(name: str, **arguments: Any) -> tuple[str, str]:
    return name, json.dumps(arguments)


@dataclass
class _Script:
    turns: list[Turn]
    requests: list[dict[str, Any]] = field(default_factory=list)


def tag(name: str) -> str:
    """The marker to put in a row's last user message so calls of that episode use script ``name``."""
    return f"[script:{name}]"


def tagged(row: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of ``row`` whose last input message ends with the tag of script ``name``."""
    params = json.loads(json.dumps(row["responses_create_params"]))
    last = params["input"][-1]
    last["content"] = f"{last['content']}\n{tag(name)}"
    return {**row, "responses_create_params": params}


def _completion(name: str, turn_index: int, turn: Turn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{name}_{turn_index}_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(turn.tool_calls)
        ]
    finish = turn.finish_reason or ("tool_calls" if turn.tool_calls else "stop")
    return {
        "id": f"chatcmpl-{name}-{turn_index}",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class ScriptedChat:
    """The policy in a background thread (``with ScriptedChat() as chat``)."""

    def __init__(self, max_requests: int | None = MAX_REQUESTS) -> None:
        self.max_requests = max_requests
        self._scripts: dict[str, _Script] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def session_url(self, session: str = "s") -> str:
        """Miles' ``base_url`` shape for a sample."""
        return f"{self.url}/sessions/{session}"

    def script(self, name: str, *turns: Turn) -> str:
        """Register (or replace) script ``name``; returns its tag."""
        with self._lock:
            self._scripts[name] = _Script(list(turns))
        return tag(name)

    def requests(self, name: str) -> list[dict[str, Any]]:
        """The chat bodies script ``name`` received, in order."""
        with self._lock:
            return list(self._scripts[name].requests)

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        text = "\n".join(str(m.get("content") or "") for m in body.get("messages", []) if m.get("role") == "user")
        found = _TAG.findall(text)
        if not found:
            return web.json_response({"error": "no [script:<name>] tag in the user messages"}, status=400)
        name = found[-1]
        turn_index = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        with self._lock:
            script = self._scripts.get(name)
            if script is None:
                return web.json_response({"error": f"no script {name!r}"}, status=400)
            script.requests.append(body)
            if (
                self.max_requests is not None and len(script.requests) > self.max_requests
            ):  # a runaway loop fails fast instead of hanging
                return web.json_response({"error": f"script {name!r} exhausted"}, status=429)
            turn = script.turns[min(turn_index, len(script.turns) - 1)]
        await asyncio.sleep(turn.delay_s)
        if turn.raw is not None or turn.status != 200:
            return web.Response(body=turn.raw or b'{"error": "scripted failure"}', status=turn.status)
        return web.json_response(_completion(name, turn_index, turn))

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/sessions/{session}/v1/chat/completions", self._chat)
        return app

    def __enter__(self) -> ScriptedChat:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            # A call whose caller hung up (its deadline passed) stops waiting: no answer to hold back.
            runner = web.AppRunner(self._app(), access_log=None, handler_cancellation=True)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self._runner = runner
            self.port = runner.addresses[0][1]
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="scripted-chat", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the scripted chat policy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(30)


@contextmanager
def scripted_chat() -> Iterator[ScriptedChat]:
    with ScriptedChat() as chat:
        yield chat
