"""``transport`` on its own: the URL rule, host names, ``request``'s one table of failures (against
real loopback servers), its cap and deadline, and the per-loop pools."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import pytest

from miles_nemogym import transport
from miles_nemogym.errors import AGENT_TIMEOUT, TRANSPORT_PEER_DROP, TRANSPORT_UNREACHABLE, Failed, UrlError
from miles_nemogym.transport import Deadline
from tests.support.fake_resources import fake_resources
from tests.support.odd_http import OddServer
from tests.support.pools import open_pools
from tests.support.ports import free_port

CAP = 1024


async def post(url: str, body: Any = None, *, seconds: float = 10.0, cap: int = CAP) -> transport.Answer:
    """One ``request`` through this loop's NeMo-Gym pool."""
    session = (await transport.pool(4)).gym
    payload = json.dumps(body).encode() if body is not None else None
    return await transport.request(
        session, "POST", url, deadline=Deadline(seconds), connect_timeout_s=5.0, cap=cap, payload=payload
    )


async def failure_of(url: str, body: Any = None, *, seconds: float = 10.0) -> Failed:
    with pytest.raises(Failed) as caught:
        await post(url, body, seconds=seconds)
    return caught.value


# -- the URL rule and host names -------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://h:8000", "https://h/base/", " http://127.0.0.1:1/ ", "http://[::1]:80"])
def test_a_plain_http_base_url_is_accepted(url: str) -> None:
    assert transport.check_url(url).scheme in ("http", "https")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (8000, "must be a string, got int"),
        ("http://h:99999", "is malformed"),
        ("http://[::1", "is malformed"),
        ("ftp://h", "is not an http(s) URL"),
        ("http://", "is not an http(s) URL"),
        ("h:8000", "is not an http(s) URL"),
        ("http://h:0", "has port 0"),
        ("http://h/?a=1", "has a query or fragment"),
        ("http://h/#top", "has a query or fragment"),
        ("http://h/?", "has a query or fragment"),
    ],
)
def test_anything_else_is_refused_saying_why(url: object, why: str) -> None:
    with pytest.raises(UrlError, match="^" + re.escape(why)):
        transport.check_url(url)


def test_a_bad_session_url_names_base_url_and_hides_its_password() -> None:
    with pytest.raises(UrlError) as caught:
        transport.check_session_url("ftp://miles:s3cret@h:1/sessions/x")
    message = str(caught.value)
    assert message.startswith("base_url 'ftp://miles:***@h:1/sessions/x' is not an http(s) URL")
    assert "s3cret" not in message and "/sessions/<session_id>" in message
    assert transport.check_session_url("http://10.0.0.2:30000/sessions/abc").path == "/sessions/abc"


@pytest.mark.parametrize(
    ("host", "wildcard", "loopback", "dialled"),
    [
        ("0.0.0.0", True, False, "127.0.0.1"),
        ("::", True, False, "[::1]"),
        ("[::]", True, False, "[::1]"),
        ("", True, False, "127.0.0.1"),
        ("localhost", False, True, "localhost"),
        ("127.0.0.5", False, True, "127.0.0.5"),
        ("::1", False, True, "[::1]"),
        ("[::1]", False, True, "[::1]"),
        ("10.1.2.3", False, False, "10.1.2.3"),
        ("gym.internal", False, False, "gym.internal"),
    ],
)
def test_host_names(host: str, wildcard: bool, loopback: bool, dialled: str) -> None:
    assert (transport.is_wildcard(host), transport.is_loopback(host), transport.connect_host(host)) == (
        wildcard,
        loopback,
        dialled,
    )


def test_no_host_is_a_wildcard_not_loopback() -> None:
    assert transport.is_wildcard(None) and not transport.is_loopback(None)


# -- request: answers ------------------------------------------------------------------------------


async def test_an_answer_is_read_whole_with_json_headers_sent() -> None:
    async with fake_resources() as fake:
        answer = await post(f"{fake.url}/echo", {"a": 1})
    assert (answer.status, answer.over_cap, answer.location) == (200, False, None)
    assert json.loads(answer.body)["arguments"] == {"a": 1}
    assert answer.size == len(answer.body)
    assert fake.tool_calls == [(None, "echo", {"a": 1})]  # the gym pool sends no cookie


async def test_an_error_status_is_an_answer_not_a_failure() -> None:
    async with fake_resources() as fake:
        answer = await post(f"{fake.url}/status", {"code": 503})
    assert (answer.status, answer.body) == (503, b"tool failed with 503")


async def test_a_redirect_is_answered_never_followed() -> None:
    async with fake_resources() as elsewhere, fake_resources() as fake:
        answer = await post(f"{fake.url}/moved", {"to": f"{elsewhere.url}/verify"})
    assert (answer.status, answer.location) == (307, f"{elsewhere.url}/verify")
    assert elsewhere.received == []


@pytest.mark.parametrize("size", [CAP + 1, 50 * CAP])
async def test_an_answer_past_the_cap_keeps_its_head_and_says_so(size: int) -> None:
    async with fake_resources() as fake:
        answer = await post(f"{fake.url}/huge", {"size": size})
    assert (answer.status, answer.over_cap, answer.body) == (200, True, b"x" * CAP)
    assert answer.size == size  # Content-Length declared it


async def test_an_answer_at_the_cap_is_whole() -> None:
    async with fake_resources() as fake:
        answer = await post(f"{fake.url}/huge", {"size": CAP})
    assert (answer.over_cap, len(answer.body)) == (False, CAP)


# -- request: the one table of failures ------------------------------------------------------------


async def test_nothing_listening_is_unreachable_and_resendable() -> None:
    error = await failure_of(f"http://127.0.0.1:{free_port()}/run", {})
    assert (error.kind, error.resendable) == (TRANSPORT_UNREACHABLE, True)
    assert str(error).startswith("connection refused, nothing listens there")
    assert isinstance(error.os_error, ConnectionRefusedError)


async def test_a_connection_dropped_after_the_request_is_a_peer_drop_never_resent() -> None:
    async with fake_resources() as fake:
        error = await failure_of(f"{fake.url}/drop", {})
    assert (error.kind, error.resendable) == (TRANSPORT_PEER_DROP, False)
    assert len(fake.tool_calls) == 1  # it arrived: resending would run it twice


async def test_a_spent_deadline_sends_nothing() -> None:
    async with fake_resources() as fake:
        error = await failure_of(f"{fake.url}/echo", {}, seconds=-1.0)
    assert (error.kind, error.resendable) == (AGENT_TIMEOUT, False)
    assert "NEMO_GYM_RUN_TIMEOUT=-1s" in str(error)
    assert fake.received == []


async def test_a_held_answer_ends_at_the_deadline() -> None:
    async with fake_resources(stall=frozenset({"echo"})) as fake:
        started = asyncio.get_running_loop().time()
        error = await failure_of(f"{fake.url}/echo", {}, seconds=0.3)
        assert fake.stalled.is_set()
    assert (error.kind, error.resendable) == (AGENT_TIMEOUT, False)
    assert asyncio.get_running_loop().time() - started < 5


async def test_the_deadline_covers_the_whole_answer_not_each_read() -> None:
    """A server trickling a byte every 0.1 s never trips a per-read timeout; the deadline ends it."""
    server = OddServer("trickle", interval_s=0.1)
    try:
        error = await failure_of(server.url, seconds=0.5)
    finally:
        server.close()
    assert (error.kind, error.resendable) == (AGENT_TIMEOUT, False)


# -- the pools -------------------------------------------------------------------------------------


async def test_one_pool_per_limit_on_a_loop_closed_together() -> None:
    first = await transport.pool(4)
    assert await transport.pool(4) is first
    other = await transport.pool(8)
    assert other is not first and open_pools() == 2
    await transport.close_pools()
    assert open_pools() == 0 and first.gym.closed and other.policy.closed
    assert await transport.pool(4) is not first  # a closed pool is opened anew


async def test_an_episode_session_keeps_its_cookie_on_the_shared_connections() -> None:
    deadline = Deadline(10)
    async with fake_resources() as fake:
        shared = await transport.pool(4)
        episode = shared.episode()
        try:
            for session in (episode, episode, shared.gym):
                await transport.request(
                    session, "POST", f"{fake.url}/seed_session" if session is episode and not fake.seeded
                    else f"{fake.url}/echo", deadline=deadline, connect_timeout_s=5, cap=CAP, payload=b"{}",
                )  # fmt: skip
        finally:
            await episode.close()
    (cookie,) = fake.seeded
    assert [session for session, _, _ in fake.tool_calls] == [cookie, None]  # the gym pool: no cookie
    assert isinstance(episode.cookie_jar, aiohttp.CookieJar) and not shared.gym.closed
