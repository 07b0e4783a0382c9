"""``serve``'s loopback relay in front of the judge endpoint: the judge's model server calls it, it calls the judge.
Why: docs/environments.md, "Judges".
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from miles_nemogym.errors import redact_url, scrub_all
from miles_nemogym.gym._logs import open_private
from miles_nemogym.gym.composition import Judge

__all__ = ["CONNECT_TIMEOUT_S", "JudgeGate"]

CONNECT_TIMEOUT_S = 10.0
"""How long the relay waits to connect to the judge endpoint before the call fails (HTTP 502)."""
_READ_TIMEOUT_S = 600.0
"""How long a connected judge may take to answer (HTTP 504 after)."""
_BODY_LIMIT = 64 << 20
_PASSED_HEADERS = ("Content-Type", "Accept")


class JudgeGate:
    """The relay for ``judge`` (:attr:`judge`: its URL, no password), listening on loopback; ``log`` gets failures.
    :meth:`start` serves, :meth:`stop` ends."""

    def __init__(self, judge: Judge, key: str | None, secrets: Iterable[str], log: Path) -> None:
        parts = urlsplit(judge.url)
        self._upstream = parts
        self._shown = redact_url(judge.url)
        self._authorization = {"Authorization": f"Bearer {key}"} if key else {}
        if not key and parts.password is not None:
            pair = f"{unquote(parts.username or '')}:{unquote(parts.password)}".encode()
            self._authorization = {"Authorization": "Basic " + base64.b64encode(pair).decode("ascii")}
        self.scrub = scrub_all(secrets)
        self.log = log
        self._log = open_private(log)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.judge = Judge(url=f"http://127.0.0.1:{self._server.server_port}{parts.path}", model=judge.model)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="judge gate", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
        with contextlib.suppress(OSError):
            os.close(self._log)

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) for one call, never raising."""
        upstream = self._upstream
        connection_type = http.client.HTTPSConnection if upstream.scheme == "https" else http.client.HTTPConnection
        connection = connection_type(upstream.hostname or "", upstream.port, timeout=CONNECT_TIMEOUT_S)
        try:
            try:
                connection.connect()
            except OSError as error:
                return self._failed(502, f"the judge endpoint {self._shown} is unreachable: {_reason(error)}")
            if connection.sock is not None:
                connection.sock.settimeout(_READ_TIMEOUT_S)
            sent = {**headers, **self._authorization}
            try:
                connection.request(method, path, body=body, headers=sent)
                response = connection.getresponse()
                answer = self.scrub(response.read(_BODY_LIMIT))
            except (OSError, http.client.HTTPException) as error:
                status = 504 if isinstance(error, socket.timeout) else 502
                return self._failed(status, f"the judge endpoint {self._shown} did not answer: {_reason(error)}")
            if response.status in (401, 403):
                # Passed on in the relay's words: a body naming a bad key makes nemo-gym's client
                # refuse every later call without sending it, and the next call may well succeed.
                said = answer.decode("utf-8", "replace")[:500]
                return self._failed(
                    response.status,
                    f"the judge endpoint {self._shown} refused the call (HTTP {response.status}: {said})",
                    plain=f"the judge endpoint {self._shown} refused the call (HTTP {response.status}); "
                    f"check NEMO_GYM_JUDGE_API_KEY and --judge-url (its answer: {self.log})",
                )
            return response.status, response.getheader("Content-Type") or "application/json", answer
        finally:
            connection.close()

    def _failed(self, status: int, message: str, plain: str | None = None) -> tuple[int, str, bytes]:
        with contextlib.suppress(OSError):
            os.write(self._log, self.scrub(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}\n".encode()))
        document = {"error": {"message": plain or message, "type": "judge_endpoint_error"}}
        return status, "application/json", json.dumps(document).encode()


def _reason(error: BaseException) -> str:
    if isinstance(error, socket.timeout):
        return "timed out"
    return (error.strerror if isinstance(error, OSError) else None) or str(error) or type(error).__name__


def _handler(gate: JudgeGate) -> type[BaseHTTPRequestHandler]:
    class Relay(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {name: self.headers[name] for name in _PASSED_HEADERS if self.headers.get(name)}
            status, content_type, answer = gate.forward(self.command, self.path, headers, body)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_POST = _relay

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per call would flood serve's output; failures are noted

    return Relay
