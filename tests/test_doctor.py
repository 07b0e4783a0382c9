"""``miles-nemogym doctor`` / ``miles_nemogym.cli._doctor.run_checks`` (the checks of ``miles_nemogym.checks``).

The Gym server is stood in for by a real loopback HTTP server serving an OpenAPI
document shaped like the one FastAPI generates for nemo-gym's ``mini_swe_agent_2`` app
(``$ref`` to a component schema, optional fields as ``anyOf``). Host checks that need a
*remote* Gym server use an in-memory fetcher: what they test is the address logic, and
no test here leaves the loopback interface.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym import checks
from miles_nemogym.checks import CheckResult, Status
from miles_nemogym.checks import _server_probe as server_probe
from miles_nemogym.checks._server_probe import FetchError, fetch_json, run_body_fields
from miles_nemogym.cli._doctor import run_checks
from miles_nemogym.cli.main import app
from tests.support.odd_http import OddServer
from tests.support.openapi import GymStandIn, openapi_document, resources_document, serving
from tests.support.ports import free_port
from tests.support.tls import Certificates, make_certificates

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/support/clean_env.py


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {result.name: result for result in results}


def statuses(results: list[CheckResult]) -> list[Status]:
    return [result.status for result in results]


# --- against the loopback server ---------------------------------------------------------


def test_all_checks_pass_against_a_server_taking_policy_base_url(
    gym: GymStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    results = run_checks(timeout_s=5)
    assert statuses(results) == [Status.passed] * 4, results
    assert checks.all_passed(results)
    assert gym.requests == ["/openapi.json"]
    field = by_name(results)["/run accepts policy_base_url"]
    assert "MiniSWEAgentRunRequest" in field.detail


def test_server_without_policy_base_url_fails_with_upgrade_fix(
    gym: GymStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    gym.serve(openapi_document(with_policy_field=False))
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    results = run_checks()
    check = by_name(results)["/run accepts policy_base_url"]
    assert check.status is Status.failed
    assert "no policy_base_url" in check.detail and "ignore" in check.detail
    assert check.fix is not None and "nemo-gym 0.7.0" in check.fix
    assert not checks.all_passed(results)


def test_server_without_run_endpoint_is_named_as_the_wrong_server(
    gym: GymStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    gym.serve(openapi_document(with_run=False))
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    check = by_name(run_checks())["/run accepts policy_base_url"]
    assert check.status is Status.failed
    assert "no POST /run" in check.detail
    assert check.fix is not None and "mini_swe_agent_2" in check.fix


def test_wrong_port_is_unreachable_and_dependent_check_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", f"http://127.0.0.1:{free_port()}")
    results = by_name(run_checks(timeout_s=5))
    reach = results["NeMo-Gym answers"]
    assert reach.status is Status.failed
    assert "connection refused" in reach.detail
    assert reach.fix is not None and "NEMO_GYM_URL" in reach.fix
    assert results["/run accepts policy_base_url"].status is Status.skipped


def test_http_error_names_the_agent_server_port(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    gym.status = 500
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    reach = by_name(run_checks())["NeMo-Gym answers"]
    assert reach.status is Status.failed
    assert "HTTP 500" in reach.detail
    assert reach.fix is not None and "agent server" in reach.fix


def test_non_json_answer_is_not_a_gym_server(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    gym.body = b"<html>hello</html>"
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    reach = by_name(run_checks())["NeMo-Gym answers"]
    assert reach.status is Status.failed
    assert "not JSON" in reach.detail


def test_silent_server_times_out_promptly() -> None:
    # Accepts connections (kernel backlog) but never answers.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(FetchError) as caught:
            fetch_json(f"http://127.0.0.1:{port}/openapi.json", 0.5)
        took = time.monotonic() - started
    assert caught.value.kind == "timeout"
    assert 0.4 <= took < 3  # its own 0.5 s, not a default socket timeout


def test_bad_settings_fail_first_and_skip_the_rest(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    monkeypatch.setenv("NEMO_GYM_RUN_TIMEOUT", "1h")
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", "sk-do-not-print")
    results = run_checks()
    assert statuses(results) == [Status.failed, Status.skipped, Status.skipped, Status.skipped]
    assert "NEMO_GYM_RUN_TIMEOUT" in results[0].detail
    assert results[0].fix is not None
    assert gym.requests == []
    assert all("sk-do-not-print" not in (r.detail + (r.fix or "")) for r in results)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("NEMO_GYM_ENVS", '{"a": {"url": "http://127.0.0.1:9", "reward_range": [0, 1%s]}}' % ("0" * 400)),
        ("NEMO_GYM_ENVS", '{"a": {"url": "http://127.0.0.1:9", "reward_range": [-1%s, 1]}}' % ("0" * 400)),
        ("NEMO_GYM_REWARD_RANGE", "0,1%s" % ("0" * 400)),
    ],
)
def test_a_huge_reward_bound_is_a_settings_error_naming_the_variable(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    text = " ".join(result.output.split())
    assert f"FAIL settings: invalid miles-nemogym configuration: {variable}=" in text
    assert "Traceback" not in result.output


def test_url_ending_in_run_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", "http://127.0.0.1:12000/run")
    first = run_checks()[0]
    assert first.status is Status.failed and "NEMO_GYM_URL" in first.detail


# --- the policy host ---------------------------------------------------------------------


def served(document: dict[str, Any]) -> server_probe.Fetcher:
    def fetch(url: str, timeout_s: float) -> Any:
        assert url.endswith("/openapi.json") and timeout_s > 0
        return copy.deepcopy(document)

    return fetch


REMOTE_GYM = "http://192.0.2.10:12000"  # TEST-NET-1: never dialled, the fetcher is in memory


@pytest.mark.parametrize(
    ("session_host", "external_host", "passes", "expected_host"),
    [
        ("127.0.0.1", None, False, "127.0.0.1"),
        ("localhost", None, False, "localhost"),
        ("10.0.0.5", None, True, "10.0.0.5"),
        ("0.0.0.0", "127.0.0.1", False, "127.0.0.1"),
        ("0.0.0.0", "0.0.0.0", False, "0.0.0.0"),
        ("127.0.0.1", "10.0.0.7", True, "10.0.0.7"),
    ],
)
def test_policy_host_against_a_remote_gym(
    monkeypatch: pytest.MonkeyPatch,
    session_host: str,
    external_host: str | None,
    passes: bool,
    expected_host: str,
) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", REMOTE_GYM)
    if external_host is not None:
        monkeypatch.setenv("MILES_ROUTER_EXTERNAL_HOST", external_host)
    results = run_checks(session_host=session_host, fetch=served(openapi_document()))
    check = by_name(results)["policy host dialable from the Gym host"]
    assert check.ok is passes, check
    assert expected_host in check.detail
    if not passes:
        assert check.fix is not None and "MILES_ROUTER_EXTERNAL_HOST" in check.fix
        assert "192.0.2.10" in check.detail


def test_loopback_policy_host_is_fine_when_gym_is_local(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    check = by_name(run_checks(session_host="127.0.0.1"))["policy host dialable from the Gym host"]
    assert check.ok
    assert "this machine" in check.detail


# --- the schema reader -------------------------------------------------------------------


def test_body_schema_reached_through_allof_and_nested_refs() -> None:
    document = openapi_document(with_policy_field=False)
    schemas = document["components"]["schemas"]
    schemas["Base"] = {"properties": {"policy_base_url": {"type": "string"}}}
    schemas["Alias"] = {"$ref": "#/components/schemas/Run2"}
    schemas["Run2"] = {"allOf": [{"$ref": "#/components/schemas/Base"}], "title": "Run2"}
    document["paths"]["/run"]["post"]["requestBody"]["content"]["application/json"]["schema"] = {
        "$ref": "#/components/schemas/Alias"
    }
    name, fields = run_body_fields(document)
    assert name == "Alias"
    assert "policy_base_url" in fields


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"openapi": "3.1.0"}, "not an OpenAPI schema"),
        ({"paths": {"/run": {"post": {}}}}, "no JSON request body"),
        (
            {
                "paths": {
                    "/run": {"post": {"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/x"}}}}}}
                }
            },
            "does not resolve",
        ),
        (
            {
                "paths": {
                    "/run": {"post": {"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/a"}}}}}}
                },
                "a": {"$ref": "#/a"},
            },
            "does not end",
        ),
    ],
)
def test_malformed_schemas_are_reported(document: dict[str, Any], message: str) -> None:
    with pytest.raises(server_probe.SchemaError, match=message):
        run_body_fields(document)


# --- the command -------------------------------------------------------------------------


def test_cli_exit_codes_and_fixes(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    runner = CliRunner()
    ok = runner.invoke(app, ["doctor", "--timeout", "5"])
    assert ok.exit_code == 0, ok.output
    assert "all checks passed" in ok.output
    gym.serve(openapi_document(with_policy_field=False))
    bad = runner.invoke(app, ["doctor"])
    assert bad.exit_code == 1
    assert "FAIL" in bad.output and "fix:" in bad.output and "policy_base_url" in bad.output


def test_with_a_policy_url_doctor_checks_what_a_policy_scan_needs(
    gym: GymStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    silent = f"http://127.0.0.1:{free_port()}/v1"
    failed = CliRunner().invoke(app, ["doctor", "--policy-base-url", silent, "--timeout", "5"])
    assert failed.exit_code == 1, failed.output
    text = " ".join(failed.output.split())
    assert f"FAIL policy endpoint answers: the policy endpoint does not answer: GET {silent}/models" in text
    assert "fix: start the policy server or correct --policy-base-url" in text
    # The stand-in answers /v1/models with a 404: an answer, so the scan would not wait on it.
    passed = CliRunner().invoke(app, ["doctor", "--policy-base-url", f"{gym.url}/v1/", "--timeout", "5"])
    assert passed.exit_code == 0, passed.output
    assert f"PASS policy endpoint answers: GET {gym.url}/v1/models" in passed.output
    assert "/v1/models" in gym.requests


def test_cli_session_host_option_reaches_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", f"http://127.0.0.1:{free_port()}")
    result = CliRunner().invoke(app, ["doctor", "--session-host", "10.9.8.7", "--timeout", "2"])
    assert result.exit_code == 1
    assert "10.9.8.7" in result.output


# --- hostile and broken servers: a bounded check and one clear FAIL line ----------------


def _with_body_schema(schema: Any, **schemas: Any) -> dict[str, Any]:
    document = openapi_document()
    document["paths"]["/run"]["post"]["requestBody"]["content"]["application/json"]["schema"] = schema
    document["components"]["schemas"].update(schemas)
    return document


def _deep_allof(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"properties": {"policy_base_url": {}}}
    for _ in range(depth):
        schema = {"allOf": [schema]}
    return schema


SELF = {"$ref": "#/components/schemas/Loop"}
ODD_DOCUMENTS = [
    ({"paths": {"/run": "x"}}, "the document's '/run' entry is a str, not an object"),
    ({"paths": {"/run": {"post": 5}}}, "POST /run is a int, not an object"),
    ({"paths": {"/run": {"post": {"requestBody": []}}}}, "POST /run's requestBody is a list, not an object"),
    (_with_body_schema({"properties": 5}), "the /run body schema's 'properties' is a int, not an object"),
    (_with_body_schema({"allOf": {"a": 1}}), "the /run body schema's 'allOf' is a dict, not a list"),
    (_with_body_schema({"allOf": ["x"]}), "the /run body schema holds a str where a schema object belongs"),
    (_with_body_schema({"$ref": "http://elsewhere/x"}), "points outside the document ('http://elsewhere/x')"),
    # Old code: 2^16 recursive visits of the same schema (over a minute at 100 % CPU).
    (_with_body_schema(SELF, Loop={"allOf": [SELF, SELF, SELF]}), None),
    (_with_body_schema(_deep_allof(100_000)), "spans over 10000 schema objects"),
]


@pytest.mark.parametrize(("document", "message"), ODD_DOCUMENTS)
def test_odd_openapi_documents_end_fast_with_a_schema_error_or_an_answer(document: Any, message: str | None) -> None:
    started = time.monotonic()
    if message is None:
        assert run_body_fields(document) == ("Loop", set())  # a cycle is read once and ends
    else:
        with pytest.raises(server_probe.SchemaError) as caught:
            run_body_fields(document)
        assert message in str(caught.value)
    assert time.monotonic() - started < 1.0


def test_a_self_including_allof_is_a_fail_line_not_a_hang(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    gym.serve(_with_body_schema(SELF, Loop={"allOf": [SELF, SELF, SELF]}))
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    started = time.monotonic()
    result = CliRunner().invoke(app, ["doctor", "--timeout", "2"])
    assert time.monotonic() - started < 3
    assert result.exit_code == 1
    output = " ".join(result.output.split())  # rich wraps long lines
    assert f"FAIL /run accepts policy_base_url: {gym.url}: the /run body (Loop) declares no policy_base_url" in output


def test_json_nested_too_deeply_is_a_fail_line(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    gym.body = b'{"paths": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 1
    output = " ".join(result.output.split())
    assert "FAIL NeMo-Gym answers: GET " in output
    assert "the answer is JSON nested too deeply to be an OpenAPI document" in output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_the_timeout_bounds_the_whole_answer_not_each_read(monkeypatch: pytest.MonkeyPatch) -> None:
    trickle = OddServer("trickle", interval_s=0.2)  # one byte every 0.2 s: no single read ever waits 1 s
    try:
        monkeypatch.setenv("NEMO_GYM_URL", trickle.url)
        started = time.monotonic()
        result = CliRunner().invoke(app, ["doctor", "--timeout", "1"])
        took = time.monotonic() - started
    finally:
        trickle.close()
    assert result.exit_code == 1
    assert 1 <= took < 3
    assert "no complete answer within 1 s" in " ".join(result.output.split())


def test_a_redirect_to_another_server_is_not_followed(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    redirect = OddServer("redirect", location=f"{gym.url}/openapi.json")
    try:
        monkeypatch.setenv("NEMO_GYM_URL", redirect.url)
        reach = by_name(run_checks(timeout_s=5))["NeMo-Gym answers"]
    finally:
        redirect.close()
    assert reach.status is Status.failed
    assert (
        reach.detail == f"GET {redirect.url}/openapi.json: HTTP 302 redirect to {gym.url}/openapi.json (not followed)"
    )
    assert reach.fix is not None and "a redirect is not followed" in reach.fix
    assert gym.requests == []  # the healthy server behind the redirect was never asked


def test_a_url_password_is_never_shown(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", gym.url.replace("http://", "http://user:s3cret-pass@"))
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "s3cret-pass" not in result.output
    assert "PASS settings: NeMo-Gym server http://user:***@127.0.0.1" in result.output


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1"])
def test_a_timeout_that_is_not_a_sane_number_of_seconds_is_a_usage_error(value: str) -> None:
    result = CliRunner().invoke(app, ["doctor", "--timeout", value])
    assert result.exit_code == 2
    assert "Invalid value for '--timeout'" in result.output


def test_a_bad_url_with_a_password_is_quoted_with_the_password_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", "http://user:s3cret-pass@gym:12000/run")
    settings = by_name(run_checks())["settings"]
    assert settings.status is Status.failed
    assert "s3cret-pass" not in settings.detail
    assert "http://user:***@gym:12000/run" in settings.detail


def test_report_is_the_plain_text_both_the_cli_and_the_launcher_print() -> None:
    results = [
        CheckResult("settings", Status.passed, "ok"),
        CheckResult("NeMo-Gym answers", Status.failed, "GET http://h:1/openapi.json: connection refused", "start it"),
        CheckResult("/run accepts policy_base_url", Status.skipped, "needs the server's answer"),
    ]
    assert checks.report(results) == [
        "PASS settings: ok",
        "FAIL NeMo-Gym answers: GET http://h:1/openapi.json: connection refused",
        "     fix: start it",
        "SKIP /run accepts policy_base_url: needs the server's answer",
        "1 check failed",
    ]
    assert checks.report(results[:1]) == ["PASS settings: ok", "all checks passed"]


# --- TLS -----------------------------------------------------------------------------------


@pytest.fixture
def tls_gym(tmp_path: Path) -> Iterator[tuple[GymStandIn, Certificates]]:
    """The stand-in served over https with a certificate from a CA nobody here trusts yet."""
    certificates = make_certificates(tmp_path / "tls")
    stand_in = GymStandIn()
    stand_in.server.socket = certificates.server_context().wrap_socket(stand_in.server.socket, server_side=True)
    stand_in.url = stand_in.url.replace("http://", "https://")
    stand_in.thread.start()
    try:
        yield stand_in, certificates
    finally:
        stand_in.server.shutdown()
        stand_in.server.server_close()


def test_an_untrusted_certificate_is_named_with_its_fix(
    tls_gym: tuple[GymStandIn, Certificates], monkeypatch: pytest.MonkeyPatch
) -> None:
    gym, certificates = tls_gym
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    reach = by_name(run_checks(timeout_s=5))["NeMo-Gym answers"]
    assert reach.status is Status.failed
    assert reach.detail == (
        f"GET {gym.url}/openapi.json: the server's TLS certificate failed verification "
        "(unable to get local issuer certificate)"
    )
    assert reach.fix is not None and "SSL_CERT_FILE" in reach.fix and "http://" in reach.fix
    assert "start the server" not in reach.fix
    # The fix works: a process that trusts the CA passes every check.
    done = subprocess.run(
        [sys.executable, "-c", "from miles_nemogym.cli.main import app; app()", "doctor", "--timeout", "10"],
        env={**os.environ, "SSL_CERT_FILE": str(certificates.ca)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all checks passed" in done.stdout


def test_https_to_a_plain_http_server_says_to_use_http(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", gym.url.replace("http://", "https://"))
    reach = by_name(run_checks(timeout_s=5))["NeMo-Gym answers"]
    assert reach.status is Status.failed
    assert "the TLS handshake failed" in reach.detail
    assert reach.fix is not None and reach.fix.startswith("use http://")


def test_the_settings_line_says_where_the_gym_url_came_from(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    assert by_name(run_checks(fetch=served(openapi_document())))["settings"].detail == (
        "NeMo-Gym server http://localhost:12000 (from the default: NEMO_GYM_URL is unset)"
    )
    monkeypatch.setenv("NEMO_GYM_URL", gym.url)
    assert by_name(run_checks())["settings"].detail == f"NeMo-Gym server {gym.url} (from NEMO_GYM_URL)"
    result = CliRunner().invoke(app, ["doctor", "--gym-url", gym.url])
    assert f"PASS settings: NeMo-Gym server {gym.url} (from --gym-url)" in " ".join(result.output.split())


def test_doctor_checks_each_resources_server_in_nemo_gym_envs(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    with serving(resources_document(any_tool=True)) as resources:
        envs = f'{{"wa": "{resources.url}", "mcqa": {{"url": "{down}", "max_steps": 2}}}}'
        monkeypatch.setenv("NEMO_GYM_URL", gym.url)
        monkeypatch.setenv("NEMO_GYM_ENVS", envs)
        result = CliRunner().invoke(app, ["doctor", "--timeout", "2"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert f"PASS environment wa: {resources.url}: POST /seed_session, /verify and every tool" in result.output
    assert f"FAIL environment mcqa: GET {down}/openapi.json: connection refused" in result.output
    assert "fix: start its resources server (`miles-nemogym serve --env mcqa`)" in result.output
    assert "PASS NeMo-Gym answers" in result.output


def test_a_host_name_that_does_not_resolve_is_named_not_a_server_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", "http://no-such-gym-host.invalid:12000")
    monkeypatch.setenv("NEMO_GYM_ENVS", '{"mcqa": "http://no-such-mcqa-host.invalid:8001"}')
    results = by_name(run_checks(timeout_s=5))
    for name, where in (("NeMo-Gym answers", "NEMO_GYM_URL"), ("environment mcqa", "mcqa's URL")):
        failed = results[name]
        assert failed.status is Status.failed and "host name does not resolve" in failed.detail
        assert failed.fix is not None and f"the host name in {where} does not resolve on this machine" in failed.fix
        assert "start" not in failed.fix


def test_with_no_rows_read_doctor_says_nothing_of_their_tools(gym: GymStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(resources_document()) as resources:
        monkeypatch.setenv("NEMO_GYM_URL", gym.url)
        monkeypatch.setenv("NEMO_GYM_ENVS", f'{{"mcqa": "{resources.url}"}}')
        passed = by_name(run_checks(timeout_s=5))["environment mcqa"]
    assert passed.status is Status.passed
    assert passed.detail == f"{resources.url}: POST /seed_session and /verify"


def test_doctor_checks_an_agent_rows_agent_server_for_post_run(
    gym: GymStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(openapi_document()) as agent, serving(resources_document(any_tool=True)) as resources:
        envs = (
            f'{{"blackjack": {{"url": "http://127.0.0.1:9", "agent": "{agent.url}"}}, '
            f'"wrong": {{"url": "http://127.0.0.1:9", "agent": "{resources.url}"}}}}'
        )
        monkeypatch.setenv("NEMO_GYM_URL", gym.url)
        monkeypatch.setenv("NEMO_GYM_ENVS", envs)
        monkeypatch.setenv("NEMO_GYM_ROLLOUT_SECRET", "s" * 32)
        result = CliRunner().invoke(app, ["doctor", "--timeout", "2"], env={"COLUMNS": "200"})
        # Without serve's rollout secret an agent row cannot be routed: named, with its fix.
        monkeypatch.delenv("NEMO_GYM_ROLLOUT_SECRET")
        unsigned = CliRunner().invoke(app, ["doctor", "--timeout", "2"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    # The agent's /run is what the rows reach (the resources server is the agent's to reach).
    assert f"PASS environment blackjack: agent {agent.url}: POST /run" in result.output
    assert f"FAIL environment wrong: {resources.url} answers but is not a NeMo-Gym agent server (no POST /run)" in (
        " ".join(result.output.split())
    )
    said = " ".join(unsigned.output.split())
    assert unsigned.exit_code == 1 and f"FAIL environment blackjack: agent {agent.url}: POST /run, but" in said
    assert "NEMO_GYM_ROLLOUT_SECRET is not set" in said and "`miles-nemogym serve --env blackjack` printed" in said


def test_an_environment_url_that_answers_as_another_environment_fails_naming_both(
    gym: GymStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(resources_document(any_tool=True)) as wrong, serving(resources_document()) as right:
        wrong.server_name = "WorkbenchResourcesServer___workplace_assistant"
        right.server_name = "MCQAResourcesServer___mcqa"
        monkeypatch.setenv("NEMO_GYM_URL", gym.url)
        monkeypatch.setenv("NEMO_GYM_ENVS", f'{{"mcqa": "{wrong.url}", "workplace_assistant": "{right.url}"}}')
        result = CliRunner().invoke(app, ["doctor", "--timeout", "5"], env={"COLUMNS": "300"})
        monkeypatch.setenv("NEMO_GYM_ENVS", f'{{"mcqa": "{right.url}", "workplace_assistant": "{wrong.url}"}}')
        fixed = CliRunner().invoke(app, ["doctor", "--timeout", "5"], env={"COLUMNS": "300"})
    said = " ".join(result.output.split())
    assert result.exit_code == 1, said
    assert (
        f"FAIL environment mcqa: {wrong.url} is not mcqa's resources server: it answers as workplace_assistant "
        "(WorkbenchResourcesServer)" in said
    )
    assert f"FAIL environment workplace_assistant: {right.url} is not workplace_assistant's" in said
    assert "fix: correct mcqa's URL in NEMO_GYM_ENVS" in said and "`miles-nemogym serve --env mcqa`" in said
    assert fixed.exit_code == 0, fixed.output
    assert "PASS environment mcqa" in fixed.output and "PASS environment workplace_assistant" in fixed.output
