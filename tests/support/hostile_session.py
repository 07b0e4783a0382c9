"""A loopback Miles session server that misbehaves on purpose, for the routing model's reach tests.

Each session (``/sessions/<32 hex>/v1/chat/completions``) answers by its ``Act``: a chat turn, an
HTTP error with a body, a redirect elsewhere, or reading the request and dropping the connection.
Every request that reached it is counted by path, so a test sees what was sent, and how often.
Its port comes from ``SESSION_PORTS``, the range the routing model is told to allow."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SESSION_PORTS = (31000, 32999)
"""Miles' harness takes its session port near 31000 (``find_available_port(31000)``: 31100-32000, then
up by 42 while taken); the reach tests' sessions bind there too. The routing model allows this range."""
SESSION_SERVERS = (f"127.0.0.1:{SESSION_PORTS[0]}-{SESSION_PORTS[1]}",)
OVERFLOW = b'{"object":"error","message":"This model\'s maximum context length is 4096 tokens.","code":400}'
"""A session's 400 saying the context is full (vLLM's words): a cut-off on both paths."""
BAD_MAX_TOKENS = b'{"object":"error","message":"max_tokens must be at least 1, got 0.","code":400}'
"""A session's 400 about a bad request: a failure on both paths."""


@dataclass(frozen=True)
class Act:
    """What a session answers: ``status``/``body``, a redirect to ``location``, or ``drop``."""

    status: int = 200
    body: bytes | None = None
    location: str | None = None
    drop: bool = False


def turn(text: str) -> bytes:
    """A chat completion whose one choice says ``text``."""
    return json.dumps(
        {
            "id": "chatcmpl-hostile",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "policy",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()


def session_id() -> str:
    """A Miles session id (``uuid4().hex``)."""
    return uuid.uuid4().hex


class HostileSession:
    """The server on a port of ``SESSION_PORTS``; ``acts[id]`` says how session ``id`` answers."""

    def __init__(self) -> None:
        self.acts: dict[str, Act] = {}
        self.received: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.port = 0

    def session_url(self, act: Act) -> str:
        """Miles' ``base_url`` of a new session answering with ``act``."""
        sid = session_id()
        self.acts[sid] = act
        return f"http://127.0.0.1:{self.port}/sessions/{sid}"

    def count(self, fragment: str = "") -> int:
        with self._lock:
            return sum(n for path, n in self.received.items() if fragment in path)

    @contextmanager
    def running(self) -> Iterator[HostileSession]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                with owner._lock:
                    owner.received[self.path] += 1
                parts = self.path.split("/")
                act = owner.acts.get(parts[2] if len(parts) > 2 else "", Act(status=404, body=b"{}"))
                if act.drop:  # the request was read: delivered; then the connection goes
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(act.status)
                if act.location:
                    self.send_header("Location", act.location)
                body = act.body if act.body is not None else b"{}"
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET = _any

        for port in range(SESSION_PORTS[0], SESSION_PORTS[1] + 1):
            try:
                self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
                break
            except OSError:
                continue
        if self._server is None:
            raise RuntimeError(f"no free port in {SESSION_PORTS}")
        self.port = self._server.server_address[1]
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=10)
