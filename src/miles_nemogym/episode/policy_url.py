"""The policy URL the NeMo-Gym server dials: Miles' session URL + ``/v1``, made reachable.

A wildcard host (Miles' ``--session-server-ip 0.0.0.0``) is replaced by
``MILES_ROUTER_EXTERNAL_HOST``, else by the local address the kernel would use to reach the
NeMo-Gym host (a UDP ``connect`` sends nothing), decided once per Gym host and logged.
"""

from __future__ import annotations

import logging
import socket
from functools import lru_cache
from urllib.parse import urlsplit, urlunsplit

from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.hosts import bracket, is_loopback, is_wildcard
from miles_nemogym.redaction import redact_url

logger = logging.getLogger(__name__)


class PolicyUrlError(MilesNemoGymError, ValueError):
    """The session URL Miles passed cannot become a policy URL."""


@lru_cache(maxsize=64)
def routable_local_address(target_host: str, target_port: int = 80) -> str:
    """The local address that routes to ``target_host``; logged once per target."""
    if is_loopback(target_host):
        address = "127.0.0.1"
    else:
        try:
            infos = socket.getaddrinfo(target_host, target_port, type=socket.SOCK_DGRAM)
            family, _, _, _, sockaddr = infos[0]
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(sockaddr)
                address = str(probe.getsockname()[0])
        except OSError as error:
            raise PolicyUrlError(
                f"the session server listens on a wildcard address and the local address that "
                f"routes to the NeMo-Gym host {target_host!r} could not be found ({error}); set "
                f"MILES_ROUTER_EXTERNAL_HOST to an address of this node that the Gym host can dial"
            ) from None
    logger.info(
        "session server listens on a wildcard address; the NeMo-Gym server at %s will dial "
        "policy URLs on %s (set MILES_ROUTER_EXTERNAL_HOST to override)",
        target_host,
        address,
    )
    return address


@lru_cache(maxsize=256)
def _dialable_netloc(netloc: str, gym_url: str, external_host: str | None) -> str:
    """The session URL's netloc made dialable; one parse per session server, not per sample."""
    parts = urlsplit(f"//{netloc}")
    host = parts.hostname or ""
    if external_host:
        host = external_host
    elif is_wildcard(host):
        gym = urlsplit(gym_url)
        host = routable_local_address(gym.hostname or "localhost", gym.port or 80)
    return bracket(host) + (f":{parts.port}" if parts.port else "")


def policy_base_url(session_url: str, gym_url: str, external_host: str | None = None) -> str:
    """``session_url`` + ``/v1`` with its host made dialable from the Gym server.

    ``external_host`` (``MILES_ROUTER_EXTERNAL_HOST``) replaces the host whatever it is,
    as upstream does; otherwise only a wildcard host is replaced.
    """
    expected = "Miles passes http://<session_server_ip>:<port>/sessions/<session_id>"
    if not isinstance(session_url, str):
        raise PolicyUrlError(f"base_url must be a string, got {type(session_url).__name__}; {expected}")
    try:
        parts = urlsplit(session_url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PolicyUrlError(f"base_url {redact_url(session_url)!r} is not an http(s) URL; {expected}")
        netloc = _dialable_netloc(parts.netloc, gym_url, external_host)
    except PolicyUrlError:
        raise
    except ValueError as error:  # urlsplit's own: a bad port, an unclosed IPv6 bracket
        raise PolicyUrlError(f"base_url {redact_url(session_url)!r} is malformed ({error}); {expected}") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return urlunsplit((parts.scheme, netloc, path, "", ""))
