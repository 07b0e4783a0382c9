"""The server checks as the scan's gate runs them, against hostile or broken servers: bounded, no redirects, one
clear error."""

from __future__ import annotations

import time

import pytest

from miles_nemogym.scan._runner import server_problem
from miles_nemogym.settings import Settings
from tests.support.odd_http import OddServer
from tests.support.openapi import GymStandIn, openapi_document
from tests.support.ports import free_port


def gate(url: str, timeout_s: float = 5.0, policy_base_url: str | None = "http://127.0.0.1:9/v1") -> str | None:
    settings = Settings.from_env({"NEMO_GYM_URL": url, "NEMO_GYM_CONNECT_TIMEOUT": str(timeout_s)})
    return server_problem(settings, policy_base_url)


def check(url: str, timeout_s: float = 5.0) -> str:
    problem = gate(url, timeout_s)
    assert problem is not None
    return problem


def test_a_trickling_server_is_cut_off_at_the_deadline() -> None:
    trickle = OddServer("trickle", interval_s=0.2)
    try:
        started = time.monotonic()
        message = check(trickle.url, timeout_s=1.5)
        took = time.monotonic() - started
    finally:
        trickle.close()
    assert 1.5 <= took < 3
    assert message.startswith(f"GET {trickle.url}/openapi.json: no complete answer within 1.5 s; start the server")


def test_a_redirect_is_refused_and_not_followed(gym: GymStandIn) -> None:
    redirect = OddServer("redirect", location=f"{gym.url}/openapi.json")
    try:
        message = check(redirect.url)
    finally:
        redirect.close()
    assert message.startswith(
        f"GET {redirect.url}/openapi.json: HTTP 302 redirect to {gym.url}/openapi.json (not followed); "
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
    assert message.startswith("GET " + trickle.url.replace("http://", "http://user:***@"))


@pytest.mark.parametrize("problem", ["no_run", "no_policy_field", "http_500", "not_json"])
def test_doctor_and_the_scan_say_the_same_about_one_server(
    gym: GymStandIn, monkeypatch: pytest.MonkeyPatch, problem: str
) -> None:
    from miles_nemogym.checks import Status
    from miles_nemogym.cli._doctor import run_checks
    from miles_nemogym.settings import ENV_VARS

    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    if problem == "no_run":
        gym.serve(openapi_document(with_run=False))
    elif problem == "no_policy_field":
        gym.serve(openapi_document(with_policy_field=False))
    elif problem == "http_500":
        gym.status = 500
    else:
        gym.body = b"<html>hello</html>"
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    failed = [result for result in run_checks() if result.status is Status.failed]
    assert len(failed) == 1, failed
    doctor_says = f"{failed[0].detail}; {failed[0].fix}"
    scan_says = check(gym.url)
    if problem == "no_policy_field":
        assert scan_says == f"{doctor_says}, or scan a golden server with --golden"
    else:
        assert scan_says == doctor_says


def test_a_policy_that_does_not_answer_is_named_before_any_episode(gym: GymStandIn) -> None:
    gym.serve(openapi_document())
    unreachable = f"http://127.0.0.1:{free_port()}/v1"
    started = time.monotonic()
    message = gate(gym.url, policy_base_url=unreachable)
    assert message is not None
    assert time.monotonic() - started < 2
    assert message.startswith(f"the policy endpoint does not answer: GET {unreachable}/models: connection refused")
    assert "correct --policy-base-url" in message
    # Any HTTP answer counts, a 404 or an API's 401 included: the stand-in has no /v1/models.
    assert gate(gym.url, policy_base_url=f"{gym.url}/v1") is None
    assert "/v1/models" in gym.requests


def test_a_golden_scan_refuses_the_policy_server_serve_started_and_passes_others(gym: GymStandIn) -> None:
    settings = Settings.from_env({"NEMO_GYM_URL": gym.url})
    gym.server_name = "SWEBenchWrapper___mini_swe_agent_2_policy"
    assert server_problem(settings, None, golden=True) == (
        f"{gym.url}/run is not a golden server: serve started it without --golden (it answers as "
        "mini_swe_agent_2_policy (SWEBenchWrapper)); restart it with `miles-nemogym serve --golden` "
        "(or scan a policy with --policy-base-url)"
    )
    assert server_problem(settings, None) is None
    gym.server_name = "SWEBenchWrapper___mini_swe_agent_2_golden"
    assert server_problem(settings, None, golden=True) is None
    gym.server_name = None
    assert server_problem(settings, None, golden=True) is None
