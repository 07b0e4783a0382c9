"""Host names as they appear in URLs and bind addresses: wildcard, loopback, IPv6 brackets.

Pure helpers shared by the policy URL, doctor and ``serve``, so the three agree on what
"listens everywhere" and "this machine" mean.
"""

from __future__ import annotations

import ipaddress

_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
"""Bind addresses meaning "every interface"; no peer can dial them."""


def _unbracket(host: str) -> str:
    """``[::1]`` → ``::1``; other hosts unchanged."""
    return host.strip("[]")


def bracket(host: str) -> str:
    """The host as it goes into a URL: IPv6 literals in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def is_wildcard(host: str | None) -> bool:
    """True for a missing host or an "every interface" address."""
    return host is None or _unbracket(host) in _WILDCARD_HOSTS


def is_loopback(host: str | None) -> bool:
    """True for ``localhost`` and loopback IP literals (bracketed or not)."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(_unbracket(host)).is_loopback
    except ValueError:
        return False


def connect_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to ``host`` (URL form)."""
    if is_wildcard(host):
        return "[::1]" if _unbracket(host) == "::" else "127.0.0.1"
    return bracket(host)
