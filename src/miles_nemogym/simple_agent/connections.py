"""HTTP connections of the loop: one pooled connector, a cookie jar per episode.

The resources server keys an episode's state on its session cookie (Starlette's
``session``), so each episode gets its own ``aiohttp.CookieJar`` and episodes never see
each other's cookies. The policy (Miles' session URL) is called without cookies, so a
resources server's cookie never reaches it even on the same host.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import TracebackType

import aiohttp

from miles_nemogym import failure_kinds as fk
from miles_nemogym.errors import MilesNemoGymError

_READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class Answer:
    """An HTTP answer read up to a cap: ``body`` holds at most ``cap`` bytes."""

    status: int
    body: bytes
    truncated: bool
    content_length: int | None


class TransportFailure(MilesNemoGymError):
    """The request got no HTTP answer; ``kind`` is a transport failure kind. ``undelivered``:
    no connection was made, so the request certainly never reached the server."""

    def __init__(self, kind: str, reason: str, *, undelivered: bool = False) -> None:
        super().__init__(reason)
        self.kind = kind
        self.undelivered = undelivered


class Connections:
    """Pooled connections for many concurrent episodes on one event loop (``async with``)."""

    def __init__(self, limit: int = 0) -> None:
        self._limit = limit
        self._connector: aiohttp.TCPConnector | None = None
        self._policy: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Connections:
        self._connector = aiohttp.TCPConnector(limit=self._limit, ttl_dns_cache=300)
        self._policy = self._session(aiohttp.DummyCookieJar())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._policy is not None:
            await self._policy.close()
        if self._connector is not None:
            await self._connector.close()
        self._policy = self._connector = None

    def _session(self, jar: aiohttp.abc.AbstractCookieJar) -> aiohttp.ClientSession:
        if self._connector is None:
            raise RuntimeError("Connections is not open; use `async with Connections()`")
        return aiohttp.ClientSession(
            connector=self._connector,
            connector_owner=False,
            cookie_jar=jar,
            timeout=aiohttp.ClientTimeout(total=None),
        )

    @property
    def policy(self) -> aiohttp.ClientSession:
        """The cookie-less session for chat-completions calls."""
        if self._policy is None:
            raise RuntimeError("Connections is not open; use `async with Connections()`")
        return self._policy

    def episode(self) -> aiohttp.ClientSession:
        """A new session with its own cookie jar (``unsafe``: loopback/IP hosts keep cookies)."""
        return self._session(aiohttp.CookieJar(unsafe=True))


async def post(
    session: aiohttp.ClientSession,
    url: str,
    *,
    data: bytes,
    cap: int,
    timeout: float | None,
    connect_timeout: float | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """POST JSON ``data``; read at most ``cap`` bytes of the answer. Raises ``TransportFailure``."""
    sent = {"Content-Type": "application/json", **(headers or {})}
    limits = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
    try:
        async with session.post(url, data=data, headers=sent, timeout=limits) as response:
            chunks: list[bytes] = []
            size = 0
            truncated = False
            while True:
                chunk = await response.content.read(_READ_CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > cap:
                    truncated = True
                    break
            body = b"".join(chunks)[:cap]
            return Answer(response.status, body, truncated, response.content_length)
    except aiohttp.ClientSSLError as error:
        raise TransportFailure(fk.TRANSPORT_TLS, f"TLS with {url}: {error}", undelivered=True) from None
    except aiohttp.ClientConnectorError as error:
        raise TransportFailure(
            fk.TRANSPORT_UNREACHABLE, f"cannot connect to {url}: {error}", undelivered=True
        ) from None
    except aiohttp.ConnectionTimeoutError:
        raise TransportFailure(
            fk.TRANSPORT_TIMEOUT, f"no connection to {url} within {connect_timeout} s", undelivered=True
        ) from None
    except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as error:
        raise TransportFailure(fk.TRANSPORT_TIMEOUT, f"no answer from {url} within {timeout} s") from error
    except (aiohttp.ClientError, OSError) as error:
        raise TransportFailure(fk.TRANSPORT_PEER_DROP, f"{url}: {type(error).__name__}: {error}") from None
