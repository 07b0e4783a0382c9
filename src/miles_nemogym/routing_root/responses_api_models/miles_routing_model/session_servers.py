"""Where the routing model may send a call: ``serve --session-server HOST:PORT`` (or an explicit
range ``HOST:PORT-PORT``), at the one path Miles' session server serves a session's model under,
``/sessions/<id>/v1`` with ``<id>`` a Miles session id (``uuid.uuid4().hex``: 32 lowercase hex
digits, ``miles/rollout/session``'s ``create_session``). Standard library only: ``serve`` parses
the same entries the routing model checks against."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["parse_session_server"]

SESSION_PATH = re.compile(r"/sessions/[0-9a-f]{32}/v1")
_PRINTABLE = re.compile(r"[!-~]+")  # no space or control character (urlsplit drops some), no non-ASCII
_ENTRY = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<first>[0-9]{1,5})(?:-(?P<last>[0-9]{1,5}))?")
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})
HOST_PORT_HELP = "give HOST:PORT (e.g. 10.0.0.5:30000), or a range HOST:PORT-PORT (e.g. 10.0.0.5:30000-30007)"


@dataclass(frozen=True)
class SessionServer:
    """One allowed session server: ``host`` (lowercase, IPv6 without brackets) on ports ``first``..``last``."""

    host: str
    first: int
    last: int


def parse_session_server(text: str) -> SessionServer:
    """``HOST:PORT`` or ``HOST:PORT-PORT`` as a ``SessionServer``; ``ValueError`` says what to give."""
    match = _ENTRY.fullmatch(text.strip())
    if match is None:
        raise ValueError(HOST_PORT_HELP)
    first = int(match["first"])
    last = int(match["last"] or first)
    if not 1 <= first <= last <= 65535:
        raise ValueError(f"ports are 1-65535 and a range goes up; {HOST_PORT_HELP}")
    return SessionServer(match["host"].strip("[]").lower(), first, last)


def forward_problem(url: str, allowed: Sequence[SessionServer], own: tuple[str, int] | None) -> str | None:
    """Why a call may not go to the policy URL ``url``, or None: it must be exactly
    ``http(s)://<allowed host:port>/sessions/<id>/v1``, and not this server's own address ``own``."""
    if not _PRINTABLE.fullmatch(url) or "\\" in url or "%" in url:
        return "it names no plain URL"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "it names no valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        return "it names no plain http(s) URL"
    if parts.query or parts.fragment or "?" in url or "#" in url or not SESSION_PATH.fullmatch(parts.path):
        return "it names no Miles session (/sessions/<32 hex digits>/v1)"
    host, port = parts.hostname, port or (443 if parts.scheme == "https" else 80)
    if own is not None and port == own[1] and (host == own[0] or own[0] in _WILDCARDS or _loopback(host)):
        return "it names this routing model's own address"
    if not any(server.host == host and server.first <= port <= server.last for server in allowed):
        shown = ", ".join(_shown(server) for server in allowed) or "none"
        return f"{parts.netloc} is not one of the session servers this model serves ({shown})"
    return None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _shown(server: SessionServer) -> str:
    host = f"[{server.host}]" if ":" in server.host else server.host
    return f"{host}:{server.first}" + (f"-{server.last}" if server.last != server.first else "")
