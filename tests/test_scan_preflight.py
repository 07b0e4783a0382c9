"""The scan's server check against hostile or broken servers: bounded, no redirects, one clear error."""

from __future__ import annotations

import asyncio
import time

import pytest

from miles_nemogym.scan.preflight import ServerCheckError, check_server
from tests.support.odd_http import OddServer
from tests.support.openapi import GymStandIn, openapi_document


def check(url: str, timeout_s: float = 5.0) -> str:
    with pytest.raises(ServerCheckError) as caught:
        asyncio.run(check_server(url, timeout_s, needs_policy_field=True))
    return str(caught.value)


def test_a_trickling_server_is_cut_off_at_the_deadline() -> None:
    trickle = OddServer("trickle", interval_s=0.2)
    try:
        started = time.monotonic()
        message = check(trickle.url, timeout_s=1.5)
        took = time.monotonic() - started
    finally:
        trickle.close()
    assert 1.5 <= took < 3
    assert message.startswith(f"{trickle.url}/openapi.json did not answer within 1.5s")


def test_a_redirect_is_refused_and_not_followed(gym: GymStandIn) -> None:
    redirect = OddServer("redirect", location=f"{gym.url}/openapi.json")
    try:
        message = check(redirect.url)
    finally:
        redirect.close()
    assert message.startswith(
        f"{redirect.url}/openapi.json answered HTTP 302 redirect to {gym.url}/openapi.json (not followed); "
    )
    assert gym.requests == []


def test_a_self_including_allof_ends_with_a_clear_error(gym: GymStandIn) -> None:
    loop = {"$ref": "#/components/schemas/Loop"}
    document = openapi_document()
    document["paths"]["/run"]["post"]["requestBody"]["content"]["application/json"]["schema"] = loop
    document["components"]["schemas"]["Loop"] = {"allOf": [loop, loop, loop], "properties": 5}
    gym.serve(document)
    started = time.monotonic()
    message = check(gym.url)
    assert time.monotonic() - started < 2
    assert message.startswith(
        f"{gym.url} answers but does not offer POST /run (the /run body schema's 'properties' is a int, not an object)"
    )


def test_a_url_password_is_hidden_in_the_error() -> None:
    trickle = OddServer("redirect", location="http://elsewhere:1/x")
    try:
        message = check(trickle.url.replace("http://", "http://user:hunter22@"))
    finally:
        trickle.close()
    assert "hunter22" not in message
    assert message.startswith(trickle.url.replace("http://", "http://user:***@"))
