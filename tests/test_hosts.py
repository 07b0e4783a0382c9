"""One reading of host names: the policy URL, doctor and ``serve`` agree on wildcard, loopback and brackets."""

from __future__ import annotations

import pytest

from miles_nemogym.episode.run import policy_base_url
from miles_nemogym.gym.config import ServeOptions
from miles_nemogym.gym.server import GymServer
from miles_nemogym.transport import bracket, connect_host, is_loopback, is_wildcard


@pytest.mark.parametrize(
    ("host", "wildcard", "loopback"),
    [
        ("0.0.0.0", True, False),
        ("::", True, False),
        ("[::]", True, False),
        ("", True, False),
        (None, True, False),
        ("127.0.0.1", False, True),
        ("127.9.9.9", False, True),
        ("::1", False, True),
        ("[::1]", False, True),
        ("localhost", False, True),
        ("10.0.0.5", False, False),
        ("gym.example", False, False),
    ],
)
def test_wildcard_and_loopback(host: str | None, wildcard: bool, loopback: bool) -> None:
    assert (is_wildcard(host), is_loopback(host)) == (wildcard, loopback)


@pytest.mark.parametrize(
    ("host", "in_url", "dialled"),
    [
        ("10.0.0.5", "10.0.0.5", "10.0.0.5"),
        ("fe80::1", "[fe80::1]", "[fe80::1]"),
        ("[fe80::1]", "[fe80::1]", "[fe80::1]"),
        ("0.0.0.0", "0.0.0.0", "127.0.0.1"),
        ("::", "[::]", "[::1]"),
        ("[::]", "[::]", "[::1]"),
    ],
)
def test_bracket_and_connect_host(host: str, in_url: str, dialled: str) -> None:
    assert bracket(host) == in_url
    assert connect_host(host) == dialled


def test_callers_agree_on_ipv6_brackets() -> None:
    # The policy URL keeps an IPv6 session host bracketed, as the Gym server's URL does.
    assert (
        policy_base_url("http://[fd00::7]:30000/sessions/s", "http://gym:1") == "http://[fd00::7]:30000/sessions/s/v1"
    )
    assert policy_base_url("http://h:1/s", "http://gym:1", "fd00::9") == "http://[fd00::9]:1/s/v1"
    server = GymServer(ServeOptions(sandbox="local", host="::", port=12000))
    server.port = 12000
    assert server.url == "http://[::1]:12000"
    local = GymServer(ServeOptions(sandbox="local", host="127.0.0.1", port=12001))
    local.port = 12001
    assert local.advertised_url == "http://127.0.0.1:12001"
