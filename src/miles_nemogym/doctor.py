"""Fast checks of a NeMo-Gym deployment: would the agent function's ``/run`` calls work?

Settings valid, server answers, ``/run`` takes ``policy_base_url`` (one probe,
:mod:`miles_nemogym.server_probe`), policy host dialable from the Gym host; given an API
policy's URL, that it answers (what an API-policy scan needs); each ``NEMO_GYM_ENVS``
resources server answers with ``/seed_session``, ``/verify`` and the tools its rows use. Serves
``miles-nemogym doctor`` and the launcher; each check ends as one PASS/FAIL/SKIP line.
The checks and why: docs/data-and-checks.md.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum
from urllib.parse import urlsplit

from miles_nemogym.episode.swe import policy_base_url
from miles_nemogym.errors import RequestError
from miles_nemogym.redaction import redact_url, redact_urls
from miles_nemogym.server_probe import (
    Fetcher,
    FetchError,
    RunEndpoint,
    SchemaError,
    ServerProblem,
    fetch_json,
    policy_field_problem,
    policy_problem,
    probe,
    resources_routes,
)
from miles_nemogym.settings import EnvironmentServer, Settings, SettingsError
from miles_nemogym.transport import bracket, is_loopback, is_wildcard

DEFAULT_TIMEOUT_S = 5.0
_DEFAULT_SESSION_HOST = "0.0.0.0"
"""What the recipe passes as ``--session-server-ip`` (listen on every interface)."""


class Status(str, Enum):
    passed = "pass"
    failed = "fail"
    skipped = "skip"
    """Not run because a check it depends on failed."""


@dataclass(frozen=True)
class CheckResult:
    """One preflight check: what was found and, when it failed, how to fix it."""

    name: str
    status: Status
    detail: str
    fix: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.passed


# --- the checks --------------------------------------------------------------------------

_CHECK_SETTINGS = "settings"
_CHECK_REACHABLE = "NeMo-Gym answers"
_CHECK_POLICY_FIELD = "/run accepts policy_base_url"
_CHECK_POLICY_HOST = "policy host dialable from the Gym host"
_CHECK_POLICY_ANSWERS = "policy endpoint answers"


def _check_policy_answers(policy_base_url: str, timeout_s: float) -> CheckResult:
    url = policy_base_url.strip().rstrip("/")
    problem = asyncio.run(policy_problem(url, timeout_s))
    if problem is not None:
        return CheckResult(_CHECK_POLICY_ANSWERS, Status.failed, problem.detail, problem.fix)
    return CheckResult(_CHECK_POLICY_ANSWERS, Status.passed, f"GET {redact_url(url)}/models: an HTTP answer")


def _check_settings(environ: Mapping[str, str], gym_url_origin: str | None) -> tuple[CheckResult, Settings | None]:
    try:
        settings = Settings.from_env(environ)
    except SettingsError as error:
        return (
            CheckResult(
                _CHECK_SETTINGS,
                Status.failed,
                redact_urls(str(error)),  # the message quotes the bad value
                "set each variable named above to the form it expects, or unset it to use the default",
            ),
            None,
        )
    if gym_url_origin is None:
        gym_url_origin = "NEMO_GYM_URL" if "NEMO_GYM_URL" in environ else "the default: NEMO_GYM_URL is unset"
    note = f" (from {gym_url_origin})"
    return (
        CheckResult(_CHECK_SETTINGS, Status.passed, f"NeMo-Gym server {redact_url(settings.gym_url)}{note}"),
        settings,
    )


def _check_server(gym_url: str, fetch: Fetcher, timeout_s: float) -> list[CheckResult]:
    """The reachability and ``policy_base_url`` checks, from one :func:`server_probe.probe`."""
    found = probe(gym_url, timeout_s, fetch)
    if isinstance(found, ServerProblem) and found.stage == "fetch":
        return [
            CheckResult(_CHECK_REACHABLE, Status.failed, found.detail, found.fix),
            CheckResult(_CHECK_POLICY_FIELD, Status.skipped, "needs the server's answer"),
        ]
    reachable = CheckResult(
        _CHECK_REACHABLE, Status.passed, f"GET {redact_url(gym_url)}/openapi.json: OpenAPI schema received"
    )
    problem = found if isinstance(found, ServerProblem) else policy_field_problem(gym_url, found)
    if problem is not None:
        return [reachable, CheckResult(_CHECK_POLICY_FIELD, Status.failed, problem.detail, problem.fix)]
    assert isinstance(found, RunEndpoint)
    detail = f"the /run body ({found.body_name}) declares policy_base_url"
    return [reachable, CheckResult(_CHECK_POLICY_FIELD, Status.passed, detail)]


def _check_policy_host(settings: Settings, session_host: str) -> CheckResult:
    gym_host = urlsplit(settings.gym_url).hostname or ""
    session_url = f"http://{bracket(session_host)}:30000/sessions/doctor"
    try:
        url = policy_base_url(session_url, settings.gym_url, settings.external_host)
    except RequestError as error:
        return CheckResult(
            _CHECK_POLICY_HOST,
            Status.failed,
            str(error),
            "set MILES_ROUTER_EXTERNAL_HOST to an address of the trainer node the Gym host can dial",
        )
    host = urlsplit(url).hostname or ""
    source = (
        "MILES_ROUTER_EXTERNAL_HOST"
        if settings.external_host
        else ("the route to the Gym host" if is_wildcard(session_host) else "the session server address")
    )
    if is_loopback(gym_host):
        return CheckResult(
            _CHECK_POLICY_HOST,
            Status.passed,
            f"the Gym server is on this machine ({gym_host}); it will dial {host} (from {source})",
        )
    if is_wildcard(host) or is_loopback(host):
        return CheckResult(
            _CHECK_POLICY_HOST,
            Status.failed,
            f"the Gym server runs on {gym_host} but would be told to dial the policy at {host} "
            f"(from {source}), which is not this machine from there",
            "set MILES_ROUTER_EXTERNAL_HOST to an address of the trainer node the Gym host can dial, "
            "or give the session server a routable address (--session-server-ip 0.0.0.0 lets the "
            "plugin pick the address that routes to the Gym host)",
        )
    return CheckResult(
        _CHECK_POLICY_HOST,
        Status.passed,
        f"the Gym server on {gym_host} will dial the policy at {host} (from {source})",
    )


def environment_check_name(name: str) -> str:
    return f"environment {name}"


def check_environment(
    name: str,
    server: EnvironmentServer,
    tools: Collection[str],
    *,
    fetch: Fetcher = fetch_json,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    tools_served: bool = True,
) -> CheckResult:
    """Environment ``name``'s resources server answers, declares ``POST /seed_session`` and
    ``/verify``, and (unless ``tools_served`` is off) a route for each of ``tools``, the tool
    names its rows give the model."""
    check = environment_check_name(name)
    url = redact_url(server.url)
    where = f"correct its URL in NEMO_GYM_ENVS (the launcher's --nemo-gym-env {name}=http://<host>:<port>)"
    try:
        routes = resources_routes(fetch(f"{server.url}/openapi.json", timeout_s))
    except FetchError as error:
        fix = f"start its resources server (`miles-nemogym serve --env {name}`), or {where}"
        return CheckResult(check, Status.failed, f"GET {url}/openapi.json: {error}", fix)
    except SchemaError as error:
        problem = str(error)
    else:
        missing = routes.missing_routes()
        problem = f"no POST {', '.join(missing)}" if missing else ""
    if problem:
        return CheckResult(
            check,
            Status.failed,
            f"{url} answers but is not a NeMo-Gym resources server ({problem})",
            f"{where}: the resources server's own address, whose /openapi.json lists POST /seed_session and "
            "/verify (not its simple_agent, the head server or a model server)",
        )
    unserved = routes.unserved_tools(tools)
    if unserved and tools_served:
        shown = ", ".join(unserved[:5]) + (f" and {len(unserved) - 5} more" if len(unserved) > 5 else "")
        return CheckResult(
            check,
            Status.failed,
            f"{url} declares no POST /<tool> for {len(unserved)} of the {len(set(tools))} tool(s) its rows "
            f"give the model ({shown}): each call would answer the model with a 404",
            f"{where}, the server of that environment, at the nemo-gym version the rows were written for; "
            f"if its verifier only reads the calls (as xlam_fc's does), pass --tools-not-served {name}",
        )
    if routes.any_tool is not None:
        served = f"every tool (POST {routes.any_tool})"
    elif unserved:
        served = f"{len(set(tools)) - len(unserved)} of the rows' {len(set(tools))} tool(s) (--tools-not-served)"
    else:
        served = f"the rows' {len(set(tools))} tool(s)"
    return CheckResult(check, Status.passed, f"{url}: POST /seed_session, /verify and {served}")


def run_checks(
    *,
    session_host: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    fetch: Fetcher = fetch_json,
    environ: Mapping[str, str] | None = None,
    gym_url_origin: str | None = None,
    policy_base_url: str | None = None,
    gym_server: bool = True,
    environments: bool = True,
) -> list[CheckResult]:
    """Every doctor check, in order; a check whose prerequisite failed is ``skipped``.

    ``session_host`` is the ``--session-server-ip`` the trainer will use (default
    ``0.0.0.0``, the recipe's); the settings are read from ``environ`` (default: this process's);
    ``gym_url_origin`` says where its NEMO_GYM_URL came from (default: the environment or the default);
    ``policy_base_url`` (an API-policy scan's) adds the check that it answers; ``gym_server``
    off (no SWE rows to run) leaves out the checks of NEMO_GYM_URL's server; ``environments``
    adds, for each server in NEMO_GYM_ENVS, that it answers as a resources server (the
    launcher checks them itself, with the tools its rows use).
    """
    host = (session_host or _DEFAULT_SESSION_HOST).strip()
    results: list[CheckResult] = []
    settings_result, settings = _check_settings(os.environ if environ is None else environ, gym_url_origin)
    if not gym_server:
        unused = "valid; no SWE rows: NEMO_GYM_URL's server is not used"
        return [settings_result if settings is None else CheckResult(_CHECK_SETTINGS, Status.passed, unused)]
    results.append(settings_result)
    if settings is None:
        reason = "needs valid settings"
        results += [
            CheckResult(name, Status.skipped, reason)
            for name in (_CHECK_REACHABLE, _CHECK_POLICY_FIELD, _CHECK_POLICY_HOST)
        ]
        return results
    results += _check_server(settings.gym_url, fetch, timeout_s)
    results.append(_check_policy_host(settings, host))
    if policy_base_url is not None:
        results.append(_check_policy_answers(policy_base_url, timeout_s))
    if environments:
        results += [
            check_environment(name, server, (), fetch=fetch, timeout_s=timeout_s)
            for name, server in settings.environments.items()
        ]
    return results


def all_passed(results: list[CheckResult]) -> bool:
    return bool(results) and all(result.ok for result in results)


_MARKS = {Status.passed: "PASS", Status.failed: "FAIL", Status.skipped: "SKIP"}


def report(results: list[CheckResult]) -> list[str]:
    """The checks as plain-text lines: ``PASS name: detail``, a ``fix:`` under each failure, a summary."""
    lines: list[str] = []
    for result in results:
        lines.append(f"{_MARKS[result.status]} {result.name}: {result.detail}")
        if result.fix and not result.ok:
            lines.append(f"     fix: {result.fix}")
    failed = sum(result.status is Status.failed for result in results)
    if failed:
        lines.append(f"{failed} check(s) failed")
    elif all_passed(results):
        lines.append("all checks passed")
    return lines
