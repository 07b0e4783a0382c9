"""One HTTP transport for every request the package makes (``/run``, a resources server's seed, tools
and ``/verify``, the policy's chat completions, the servers' probes), the rule for a URL it sends to,
and what host names mean (wildcard, loopback). No redirect followed, the answer read up to a cap, one
deadline for all of it, certificates checked, and one table (``_failure``) from what went wrong to a
failure kind and whether it may be sent again: docs/episode-pipeline.md ("Delivering").
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import ipaddress
import logging
import socket
import ssl
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from types import SimpleNamespace
from urllib.parse import SplitResult, urlsplit

import aiohttp

from miles_nemogym.errors import (
    AGENT_TIMEOUT,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TIMEOUT,
    TRANSPORT_TLS,
    TRANSPORT_UNREACHABLE,
    Failed,
    UrlError,
    redact_url,
    redact_urls,
)

__all__ = [
    "bracket",
    "close_pools",
    "connect_host",
    "get",
    "is_loopback",
    "is_wildcard",
]

logger = logging.getLogger(__name__)

# Below the NeMo-Gym servers' own keep-alive (uvicorn timeout_keep_alive=30 s): reusing a
# connection the server is closing at that instant fails after the request may have left.
_KEEPALIVE_S = 15.0
_EXIT_CLOSE_TIMEOUT_S = 5.0
_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}


def check_url(url: object) -> SplitResult:
    """The parts of an ``http(s)`` base URL with a host, a valid port, no query or fragment; else ``UrlError``."""
    if not isinstance(url, str):
        raise UrlError(f"must be a string, got {type(url).__name__}")
    text = url.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as error:  # urlsplit's own: a bad port, an unclosed IPv6 bracket
        raise UrlError(f"is malformed ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlError("is not an http(s) URL")
    if port == 0:
        raise UrlError("has port 0 (the port must be a number from 1 to 65535)")
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise UrlError("has a query or fragment: give the base URL alone, paths are appended to it")
    return parts


# -- host names as they appear in URLs and bind addresses (the policy URL, doctor, serve) ----------

_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})  # bind addresses meaning "every interface": not dialable


def bracket(host: str) -> str:
    """The host as it goes into a URL: IPv6 literals in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def is_wildcard(host: str | None) -> bool:
    return host is None or host.strip("[]") in _WILDCARD_HOSTS


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def connect_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to ``host`` (URL form)."""
    if is_wildcard(host):
        return "[::1]" if host.strip("[]") == "::" else "127.0.0.1"
    return bracket(host)


_SESSION_URL = "http://<session_server_ip>:<port>/sessions/<session_id>"


def check_session_url(session_url: object) -> SplitResult:
    """The parts of the session URL Miles passes as ``base_url``; ``UrlError`` when it is not plain http(s)."""
    try:
        return check_url(session_url)
    except UrlError as error:
        shown = repr(redact_url(session_url)) if isinstance(session_url, str) else ""
        raise UrlError(f"base_url {shown + ' ' if shown else ''}{error}; Miles passes {_SESSION_URL}") from None


class Deadline:
    """The moment one try of an episode must be over (``NEMO_GYM_RUN_TIMEOUT`` from its start);
    ``sent`` is resolved as a request of the try to a NeMo-Gym server leaves (the server was reached)."""

    def __init__(self, seconds: float, sent: asyncio.Future[None] | None = None) -> None:
        self.seconds = seconds
        self.sent = sent
        self._at = asyncio.get_running_loop().time() + seconds

    def remaining(self) -> float:
        return self._at - asyncio.get_running_loop().time()


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, its decoded body read up to the caller's cap."""

    status: int
    body: bytes  # when over_cap, only what was read before the cap was passed
    over_cap: bool = False
    size: int = 0  # decoded bytes seen (or declared by Content-Length) when the read stopped
    location: str | None = None  # a redirect's target (never followed)
    cookies: tuple[str, ...] = ()  # the names of the cookies it sets (checks.identify reads them)


async def request(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    deadline: Deadline,
    connect_timeout_s: float,
    cap: int,
    payload: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """Send one request, reading its answer up to ``cap`` decoded bytes; ``Failed`` when no HTTP answer came."""
    remaining = deadline.remaining()
    if remaining <= 0:
        raise Failed(AGENT_TIMEOUT, _deadline_reason(deadline), resendable=False)
    timeout = aiohttp.ClientTimeout(total=remaining, sock_connect=min(connect_timeout_s, remaining))
    sent = {**_JSON_HEADERS, **headers} if headers else _JSON_HEADERS
    answered = False
    try:
        async with session.request(
            method,
            url,
            data=payload,
            headers=sent,
            timeout=timeout,
            allow_redirects=False,
            trace_request_ctx=deadline.sent,
        ) as response:
            answered = True
            body, over_cap, size = await _read(response, cap)
            location = response.headers.get("Location") if 300 <= response.status < 400 else None
            return Answer(response.status, body, over_cap, size, location, tuple(response.cookies))
    except Exception as error:
        failed = _failure(error, deadline, connect_timeout_s)
        if isinstance(failed, Failed):
            failed.answered = answered
        raise failed from None


async def get(url: str, timeout_s: float, cap: int) -> Answer:
    """One ``GET`` (a server check's) on this loop's one-connection pool, ``timeout_s`` for all of it."""
    connections = await pool(1)
    return await request(
        connections.gym, "GET", url, deadline=Deadline(timeout_s), connect_timeout_s=timeout_s, cap=cap
    )


def _failure(error: Exception, deadline: Deadline, connect_timeout_s: float) -> Exception:
    """The one table: what went wrong -> ``Failed`` (anything else is returned as is: a defect)."""
    if isinstance(error, aiohttp.ClientSSLError):  # before ClientConnectorError, its base
        # Nothing of the request left; waiting helps only once the certificate is fixed.
        return Failed(TRANSPORT_TLS, f"TLS: {_text(error.os_error)}", resendable=True, os_error=error)
    if isinstance(error, aiohttp.ClientConnectorError):
        return Failed(TRANSPORT_UNREACHABLE, _connect_reason(error.os_error), resendable=True, os_error=error.os_error)
    if deadline.remaining() <= 0:
        return Failed(AGENT_TIMEOUT, _deadline_reason(deadline), resendable=False)
    if isinstance(error, aiohttp.ConnectionTimeoutError):
        return Failed(
            TRANSPORT_TIMEOUT,
            f"no connection within {connect_timeout_s:g} s (NEMO_GYM_CONNECT_TIMEOUT)",
            resendable=True,
        )
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        return Failed(AGENT_TIMEOUT, _deadline_reason(deadline), resendable=False)
    if isinstance(error, (aiohttp.ClientError, OSError)):
        # Disconnects, resets, payload and protocol errors: the request may have arrived.
        return Failed(TRANSPORT_PEER_DROP, f"{type(error).__name__}: {_text(error)}", resendable=False)
    return error


def _deadline_reason(deadline: Deadline) -> str:
    return f"no answer within NEMO_GYM_RUN_TIMEOUT={deadline.seconds:g}s (each try's deadline)"


def _connect_reason(error: OSError) -> str:
    if isinstance(error, socket.gaierror):
        return f"host name does not resolve ({_text(error)})"
    if isinstance(error, ConnectionRefusedError):
        return f"connection refused, nothing listens there ({_text(error)})"
    return f"cannot connect ({_text(error)})"


def _text(error: object) -> str:
    return redact_urls(str(error) or type(error).__name__)


async def _read(response: aiohttp.ClientResponse, cap: int) -> tuple[bytes, bool, int]:
    """(the decoded body, whether it passed ``cap``, its size seen); never more than ``cap`` kept."""
    declared = response.content_length if not response.headers.get("Content-Encoding") else None
    if declared is not None and declared <= cap:
        body = await response.read()  # its length is known and allowed: one read, not a chunk loop
        return body, False, len(body)
    # Its size is unknown, encoded or over the cap: read up to the cap (a tool's output keeps its head).
    seen = bytearray()
    async for chunk in response.content.iter_any():
        seen += chunk
        if len(seen) > cap:
            return bytes(seen[:cap]), True, max(len(seen), declared or 0)
    return bytes(seen), False, len(seen)


@dataclass(eq=False)
class Pool:
    """One event loop's connections, for one ``NEMO_GYM_MAX_CONCURRENCY``."""

    gym: aiohttp.ClientSession  # cookie-less, at most limit connections: /run and every NeMo-Gym server
    policy: aiohttp.ClientSession  # cookie-less, a pool of its own: the policy (Miles' session server)

    def episode(self) -> aiohttp.ClientSession:
        """A session with its own cookie jar (``unsafe``: IP hosts too) on the gym side's connections."""
        return _session(self.gym.connector, aiohttp.CookieJar(unsafe=True))

    async def close(self) -> None:
        for session in (self.gym, self.policy):
            connector = session.connector
            await session.close()
            if connector is not None:
                await connector.close()


def _session(
    connector: aiohttp.BaseConnector | None, jar: aiohttp.abc.AbstractCookieJar, *, gym: bool = True
) -> aiohttp.ClientSession:
    # Timeouts are per request; a NeMo-Gym side's request resolves its try's ``Deadline.sent`` as it leaves.
    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(_headers_sent)
    return aiohttp.ClientSession(
        connector=connector,
        connector_owner=False,
        cookie_jar=jar,
        timeout=aiohttp.ClientTimeout(total=None),
        trace_configs=[trace] if gym else None,
    )


async def _headers_sent(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestHeadersSentParams
) -> None:
    sent = context.trace_request_ctx
    if isinstance(sent, asyncio.Future) and not sent.done():
        sent.set_result(None)


@functools.cache
def trust_store() -> ssl.SSLContext:
    """The system's CA certificates, loaded once per process (~25 ms of CPU) and shared by every pool."""
    return ssl.create_default_context()


def _connector(limit: int) -> aiohttp.TCPConnector:
    return aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=_KEEPALIVE_S, ssl=trust_store())


@dataclass
class _LoopPools:
    by_limit: dict[int, Pool] = field(default_factory=dict)
    guard: AsyncGenerator[None, None] | None = None


# Keyed by loop (a session is never shared across loops), then by limit (in-flight requests keep the old pool).
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPools] = weakref.WeakKeyDictionary()


async def pool(limit: int) -> Pool:
    """This loop's pool for at most ``limit`` NeMo-Gym connections, opened on first use, closed with the loop."""
    loop = asyncio.get_running_loop()
    pools = _pools.get(loop)
    if pools is None:
        pools = _pools[loop] = _LoopPools()
        pools.guard = _closed_at_shutdown(pools)
        await pools.guard.__anext__()  # the loop now tracks it (loop.shutdown_asyncgens)
    found = pools.by_limit.get(limit)
    if found is None or found.gym.closed:
        found = pools.by_limit[limit] = Pool(
            gym=_session(_connector(limit), aiohttp.DummyCookieJar()),
            policy=_session(_connector(limit), aiohttp.DummyCookieJar(), gym=False),
        )
    return found


async def _closed_at_shutdown(pools: _LoopPools) -> AsyncGenerator[None, None]:
    """Suspended until the loop shuts down its async generators (``asyncio.run`` does), then closes its pools."""
    try:
        yield
    finally:
        await _close_all(pools)


async def _close_all(pools: _LoopPools) -> None:
    opened = list(pools.by_limit.values())
    pools.by_limit.clear()
    for one in opened:
        await one.close()


async def close_pools() -> None:
    """Close this loop's pools (tests and CLI shutdown; Miles never needs to)."""
    pools = _pools.pop(asyncio.get_running_loop(), None)
    if pools is not None:
        await _close_all(pools)
        if pools.guard is not None:
            await pools.guard.aclose()


@atexit.register
def _close_at_exit() -> None:
    """Close every loop's pools at interpreter exit, on their own loops: Miles runs its loop forever on
    a daemon thread, which never shuts down its async generators ("Unclosed connector")."""
    for loop, pools in list(_pools.items()):
        if not pools.by_limit or loop.is_closed():
            continue
        try:
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(_close_all(pools), loop).result(timeout=_EXIT_CLOSE_TIMEOUT_S)
            else:
                loop.run_until_complete(_close_all(pools))
        except Exception as error:  # exit must go on; the warning is all that is lost
            logger.debug("could not close the connection pools at exit: %r", error)
