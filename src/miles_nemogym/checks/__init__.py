"""Pre-run checks: one result type, one runner, one report, and the NeMo-Gym checks written once."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property, partial
from typing import Any, Literal
from urllib.parse import urlsplit

from miles_nemogym import fit, pins
from miles_nemogym.checks._server_probe import (
    Fetcher,
    FetchError,
    Identifier,
    SchemaError,
    ServerIdentity,
    fetch_json,
    identify,
    resources_routes,
    run_body_fields,
)
from miles_nemogym.episode import run as swe_run
from miles_nemogym.errors import RequestError, SettingsError, counted, redact_url, redact_urls
from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import (
    SECRET_VARIABLE,
    secret_problem,
)
from miles_nemogym.settings import Settings
from miles_nemogym.transport import bracket, is_loopback, is_wildcard

__all__ = [
    "CheckResult",
    "Fetcher",
    "Target",
    "Wanted",
    "all_passed",
    "environment_failed",
    "report",
    "run",
]


class Status(str, Enum):
    passed = "pass"
    failed = "fail"
    skipped = "skip"
    """Not run because a check it needs did not pass."""


@dataclass(frozen=True)
class CheckResult:
    """One check: what was found and, when it failed, how to fix it."""

    name: str
    status: Status
    detail: str
    fix: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.passed

    @classmethod
    def passed(cls, name: str, detail: str) -> CheckResult:
        return cls(name, Status.passed, detail)

    @classmethod
    def failed(cls, name: str, detail: str, fix: str) -> CheckResult:
        return cls(name, Status.failed, detail, fix)


@dataclass
class Target:
    """What the NeMo-Gym checks look at; the server's ``/openapi.json`` is fetched once."""

    settings: Settings | SettingsError
    gym_url_origin: str = ""
    session_host: str | None = None
    """The trainer's ``--session-server-ip``; None: ``0.0.0.0``, the recipe's (every interface)."""
    timeout_s: float = 5.0
    fetch: Fetcher = fetch_json
    identify: Identifier = identify
    policy_base_url: str | None = None
    tools: Mapping[str, Collection[str]] = field(default_factory=dict)
    """Environment -> the tool names its rows give the model, for each one whose rows were read (doctor reads none)."""
    tools_not_served: Collection[str] = ()
    gym_server: bool = True
    """False when no row is a SWE row: NEMO_GYM_URL's server is not used."""

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, gym_url_origin: str | None = None, **given: Any
    ) -> Target:
        """The plugin's variables in ``environ`` (default: this process's), and where NEMO_GYM_URL came from."""
        environ = os.environ if environ is None else environ
        try:
            settings: Settings | SettingsError = Settings.from_env(environ)
        except SettingsError as error:
            settings = error
        if gym_url_origin is None:
            gym_url_origin = "NEMO_GYM_URL" if "NEMO_GYM_URL" in environ else "the default: NEMO_GYM_URL is unset"
        return cls(settings, gym_url_origin, **given)

    @property
    def valid(self) -> Settings:
        """The settings, for a check that needs the settings check."""
        assert isinstance(self.settings, Settings), "a check that reads the settings needs the settings check"
        return self.settings

    @cached_property
    def run_body(self) -> tuple[str, set[str]] | FetchError | SchemaError:
        """``POST /run``'s body name and fields from the Gym server's ``/openapi.json``, or why not."""
        try:
            return run_body_fields(self.fetch(f"{self.valid.gym_url}/openapi.json", self.timeout_s))
        except (FetchError, SchemaError) as error:
            return error


Found = tuple[Status, str, str | None]
"""What a check found: its status, detail and (when it failed) fix."""


def _passed(detail: str) -> Found:
    return Status.passed, detail, None


def _failed(detail: str, fix: str) -> Found:
    return Status.failed, detail, fix


@dataclass(frozen=True)
class Check:
    """A named check of a :class:`Target`; ``gives`` is what a check that needs it lacks when it fails."""

    name: str
    test: Callable[[Target], Found]
    needs: tuple[Check, ...] = ()
    gives: str = ""


def all_passed(results: Sequence[CheckResult]) -> bool:
    return bool(results) and all(result.ok for result in results)


_CONTINUATION = "     "
"""Under the detail of a ``PASS``/``FAIL`` line, as the ``fix:`` lines are."""


def report(results: Sequence[CheckResult], width: int | None = None) -> list[str]:
    """``PASS name: detail`` lines, a ``fix:`` under each failure, a summary; wrapped to ``width`` if given."""
    lines: list[str] = []
    for result in results:
        lines.append(f"{result.status.value.upper()} {result.name}: {result.detail}")
        if result.fix and not result.ok:
            lines.append(f"{_CONTINUATION}fix: {result.fix}")
    failed = sum(result.status is Status.failed for result in results)
    if failed:
        lines.append(f"{counted(failed, 'check')} failed")
    elif all_passed(results):
        lines.append("all checks passed")
    return lines if width is None else fit.wrap(lines, width, indent=_CONTINUATION)


def _settings(target: Target) -> Found:
    if isinstance(target.settings, SettingsError):
        return _failed(
            redact_urls(str(target.settings)),  # the message quotes the bad value
            "set each variable named above to the form it expects, or unset it to use the default",
        )
    if not target.gym_server:
        return _passed("valid; no SWE rows: NEMO_GYM_URL's server is not used")
    return _passed(f"NeMo-Gym server {redact_url(target.settings.gym_url)} (from {target.gym_url_origin})")


_WRONG_SERVER_FIX = (
    "NEMO_GYM_URL must be the mini_swe_agent_2 agent server's own address (the port "
    "in its config, e.g. 12000; its /openapi.json lists POST /run), not the Gym head server or a model server"
)
_FETCH_FIXES = {
    "redirect": "NEMO_GYM_URL must be the mini_swe_agent_2 server's own address: a redirect "
    "is not followed, since the trainer's /run calls are not either",
    "http": _WRONG_SERVER_FIX,
    "not-json": _WRONG_SERVER_FIX,
    "too-large": _WRONG_SERVER_FIX,
    "certificate": "make this machine trust the server's certificate: set SSL_CERT_FILE to a PEM file holding "
    "the CA that signed it (or add that CA to the system's trust store), and name the host the certificate "
    "is issued for; or use http:// if the server does not serve TLS",
    "tls": "use http:// if the server does not serve TLS (https:// only for a server that does)",
    "dns": "the host name in NEMO_GYM_URL does not resolve on this machine: check the URL for a typo, "
    "or give the server's IP address or a name this machine's DNS knows",
}
_UNREACHABLE_FIX = (
    "start the server (`miles-nemogym serve`, or `gym env start` with the mini_swe_agent_2 config) "
    "and set NEMO_GYM_URL to its http://host:port; check that no firewall blocks "
    "that port from this machine"
)


def _gym_answers(target: Target) -> Found:
    url, body = redact_url(target.valid.gym_url), target.run_body
    if isinstance(body, FetchError):
        return _failed(f"GET {url}/openapi.json: {body}", _FETCH_FIXES.get(body.kind, _UNREACHABLE_FIX))
    return _passed(f"GET {url}/openapi.json: OpenAPI schema received")


def _run_offered(target: Target) -> Found:
    """``POST /run`` is declared with a JSON body (all a golden scan needs)."""
    body = target.run_body
    if isinstance(body, tuple):
        return _passed(f"the /run body ({body[0]}) is declared")
    url = redact_url(target.valid.gym_url)
    return _failed(f"{url} answers but does not offer POST /run ({body})", _WRONG_SERVER_FIX)


def _policy_field(target: Target) -> Found:
    body = target.run_body
    if not isinstance(body, tuple):
        return _run_offered(target)
    name, fields = body
    if "policy_base_url" in fields:
        return _passed(f"the /run body ({name}) declares policy_base_url")
    return _failed(
        f"{redact_url(target.valid.gym_url)}: the /run body ({name}) declares no policy_base_url, so this "
        "server would ignore the trainer's policy URL and run every episode on its own configured model",
        f"run nemo-gym {pins.NEMO_GYM_VERSION} (the version this package is tested with) or any release "
        "whose mini_swe_agent_2 /run takes policy_base_url",
    )


_EXTERNAL_HOST_FIX = "set MILES_ROUTER_EXTERNAL_HOST to an address of the trainer node the Gym host can dial"


def _policy_host(target: Target) -> Found:
    settings, session_host = target.valid, (target.session_host or "0.0.0.0").strip()
    gym_host = urlsplit(settings.gym_url).hostname or ""
    session_url = f"http://{bracket(session_host)}:30000/sessions/doctor"
    try:
        host = urlsplit(swe_run.policy_base_url(session_url, settings.gym_url, settings.external_host)).hostname or ""
    except RequestError as error:
        return _failed(str(error), _EXTERNAL_HOST_FIX)
    source = (
        "MILES_ROUTER_EXTERNAL_HOST"
        if settings.external_host
        else ("the route to the Gym host" if is_wildcard(session_host) else "the session server address")
    )
    if is_loopback(gym_host):
        return _passed(f"the Gym server is on this machine ({gym_host}); it will dial {host} (from {source})")
    if is_wildcard(host) or is_loopback(host):
        return _failed(
            f"the Gym server runs on {gym_host} but would be told to dial the policy at {host} "
            f"(from {source}), which is not this machine from there",
            f"{_EXTERNAL_HOST_FIX}, or give the session server a routable address (--session-server-ip 0.0.0.0 "
            "lets the plugin pick the address that routes to the Gym host)",
        )
    return _passed(f"the Gym server on {gym_host} will dial the policy at {host} (from {source})")


def _golden_server(target: Target) -> Found:
    """The SWE server is not one ``serve`` started without ``--golden`` (others: the scan's guard stops them)."""
    from miles_nemogym.gym.config import ServeOptions

    url = target.valid.gym_url
    try:
        identity = target.identify(f"{url}/openapi.json", target.timeout_s)
    except FetchError:
        identity = None
    if identity is not None and identity.instance == ServeOptions(golden=False).instance_name:
        return _failed(
            f"{url}/run is not a golden server: serve started it without --golden (it answers as {identity})",
            "restart it with `miles-nemogym serve --golden` (or scan a policy with --policy-base-url)",
        )
    return _passed(f"{redact_url(url)} is not a policy server `miles-nemogym serve` started")


_NO_ANSWER = frozenset({"timeout", "dns", "refused", "connect", "certificate", "tls"})
"""Fetch failures that mean no HTTP answer at all (any status code is an answer)."""


def _policy_answers(target: Target) -> Found:
    """``GET <policy_base_url>/models`` gets any HTTP answer (no key is sent: a 401 counts)."""
    assert target.policy_base_url is not None, "the policy answers check needs the target's policy_base_url"
    url = target.policy_base_url.strip().rstrip("/")
    try:
        target.fetch(f"{url}/models", target.timeout_s)
    except FetchError as error:
        if error.kind in _NO_ANSWER:
            return _failed(
                f"the policy endpoint does not answer: GET {redact_url(url)}/models: {error}",
                "start the policy server or correct --policy-base-url (an OpenAI-compatible API "
                "ending in /v1, reachable from this machine and the Gym server's)",
            )
    return _passed(f"GET {redact_url(url)}/models: an HTTP answer")


_SETTINGS = Check("settings", _settings, gives="valid settings")
_GYM_ANSWERS = Check("NeMo-Gym answers", _gym_answers, (_SETTINGS,), gives="the server's answer")

Wanted = Literal[
    "settings", "gym answers", "run offered", "policy field", "policy host", "policy answers", "golden server"
]
_WANTED: dict[Wanted, Check] = {
    "settings": _SETTINGS,
    "gym answers": _GYM_ANSWERS,
    "run offered": Check("/run offered", _run_offered, (_GYM_ANSWERS,)),
    "policy field": Check("/run accepts policy_base_url", _policy_field, (_GYM_ANSWERS,)),
    "policy host": Check("policy host dialable from the Gym host", _policy_host, (_SETTINGS,)),
    "policy answers": Check("policy endpoint answers", _policy_answers),
    "golden server": Check("golden server", _golden_server, (_GYM_ANSWERS,)),
}


def environment_failed(name: str, detail: str, fix_tail: str) -> CheckResult:
    """Environment ``name``'s check, failed with ``detail``; its fix starts its server, then ``fix_tail``."""
    return CheckResult(f"environment {name}", Status.failed, detail, f"{_start_environment_fix(name)} {fix_tail}")


def _start_environment_fix(name: str) -> str:
    """Start ``name``'s server with serve when nemo-gym ships it, else correct the rows' name."""
    serve = f"start its resources server (`miles-nemogym serve --env {name}`)"
    retype = "re-run `miles-nemogym convert` with the right --env name (it refuses names nemo-gym does not ship)"
    from miles_nemogym.gym import wheel

    if wheel.cached_wheel() is None:  # a preflight downloads nothing to word a fix
        return f"{serve} if nemo-gym ships it; if the name is misspelt, {retype}"
    from miles_nemogym.gym.environments import check_shipped

    try:
        unknown = check_shipped([name])
    except (OSError, RuntimeError, ValueError, zipfile.BadZipFile):  # an unreadable cached wheel: say both
        return f"{serve} if nemo-gym ships it; if the name is misspelt, {retype}"
    return f"{unknown}: {retype}; if {name!r} is your own environment, start its resources server" if unknown else serve


def _environment(name: str, target: Target) -> Found:
    """``name``'s resources server answers with ``/seed_session``, ``/verify`` and a route per tool its rows use."""
    server = target.valid.environments[name]
    if server.agent is not None:
        return _agent(name, server.agent, target)
    tools = target.tools.get(name, ())
    url = redact_url(server.url)
    where = f"correct its URL in NEMO_GYM_ENVS (the launcher's --nemo-gym-env {name}=http://<host>:<port>)"
    try:
        paths, any_tool = resources_routes(target.fetch(f"{server.url}/openapi.json", target.timeout_s))
    except FetchError as error:
        if error.kind == "dns":
            return _failed(
                f"GET {url}/openapi.json: {error}",
                f"the host name in {name}'s URL does not resolve on this machine: check NEMO_GYM_ENVS for a typo "
                f"(the launcher's --nemo-gym-env {name}=http://<host>:<port>), or give the server's IP address "
                "or a name this machine's DNS knows",
            )
        return _failed(f"GET {url}/openapi.json: {error}", f"{_start_environment_fix(name)}, or {where}")
    except SchemaError as error:
        problem = str(error)
    else:
        missing = [path for path in ("/seed_session", "/verify") if path not in paths]
        problem = f"no POST {', '.join(missing)}" if missing else ""
    if problem:
        return _failed(
            f"{url} answers but is not a NeMo-Gym resources server ({problem})",
            f"{where}: the resources server's own address, whose /openapi.json lists POST /seed_session and "
            "/verify (not its simple_agent, the head server or a model server)",
        )
    try:
        identity = target.identify(f"{server.url}/openapi.json", target.timeout_s)
    except FetchError:
        identity = None  # it answered a moment ago; the routes above are all it said
    if identity is not None and not _serves(identity, name):
        return _failed(
            f"{url} is not {name}'s resources server: it answers as {identity}",
            f"correct {name}'s URL in NEMO_GYM_ENVS (the launcher's --nemo-gym-env {name}=http://<host>:<port>) "
            f"to the address `miles-nemogym serve --env {name}` prints for {name}; this one serves "
            f"{identity.instance}'s rows",
        )
    unserved = [] if any_tool else sorted({tool for tool in tools if f"/{tool}" not in paths})
    said = counted(len(set(tools)), "tool")
    if unserved and name not in target.tools_not_served:
        shown = ", ".join(unserved[:5]) + (f" and {len(unserved) - 5} more" if len(unserved) > 5 else "")
        return _failed(
            f"{url} declares no POST /<tool> for {len(unserved)} of the {said} its rows give the model ({shown}): "
            "each call would answer the model with a 404",
            f"{where}, the server of that environment, at the nemo-gym version the rows were written for; "
            f"if its verifier only reads the calls (as xlam_fc's does), pass --tools-not-served {name}",
        )
    if any_tool is not None:
        served = f"every tool (POST {any_tool})"
    elif name not in target.tools:  # no rows of it were read (doctor): nothing to say about their tools
        served = ""
    elif unserved:
        served = f"{len(set(tools)) - len(unserved)} of the rows' {said} (--tools-not-served)"
    else:
        served = f"the rows' {said}"
    return _passed(
        f"{url}: POST /seed_session, /verify and {served}" if served else f"{url}: POST /seed_session and /verify"
    )


def _serves(identity: ServerIdentity, name: str) -> bool:
    """Whether ``identity`` is ``name``'s server: by the cached wheel's config, else its name holds ``name``."""
    from miles_nemogym.gym import wheel

    if identity.instance == name:
        return True
    if wheel.cached_wheel() is not None:
        from miles_nemogym.gym.environments import plan
        from miles_nemogym.gym.venv import GymEnvironmentError

        try:
            return identity.instance == plan([name])[0].instance
        except (GymEnvironmentError, OSError, RuntimeError, ValueError, zipfile.BadZipFile):
            pass  # not a name nemo-gym ships (your own environment), or an unreadable wheel
    return name in identity.instance


def _agent(name: str, agent: str, target: Target) -> Found:
    """Environment ``name``'s agent server answers and declares ``POST /run`` (its resources server is its own)."""
    url = redact_url(agent)
    where = f"correct its agent URL in NEMO_GYM_ENVS ({name}.agent)"
    try:
        paths, _ = resources_routes(target.fetch(f"{agent}/openapi.json", target.timeout_s))
    except FetchError as error:
        return _failed(f"GET {url}/openapi.json: {error}", f"{_start_environment_fix(name)}, or {where}")
    except SchemaError as error:
        return _failed(f"{url} answers but is not a NeMo-Gym agent server ({error})", where)
    if "/run" not in paths:
        return _failed(
            f"{url} answers but is not a NeMo-Gym agent server (no POST /run)",
            f"{where}: the agent server's own address (`miles-nemogym serve --env {name}` prints it)",
        )
    settings = target.settings
    secret = settings.rollout_secret if isinstance(settings, Settings) else None
    problem = secret_problem(secret.get_secret_value() if secret else "")
    if problem:
        return _failed(
            f"agent {url}: POST /run, but {problem}: the routing model forwards only the model calls of "
            "rollout ids signed with it",
            f"export the {SECRET_VARIABLE} line `miles-nemogym serve --env {name}` printed",
        )
    return _passed(f"agent {url}: POST /run")


def run(
    target: Target, wanted: Iterable[Wanted], *, environments: bool | Collection[str] = False
) -> Iterator[CheckResult]:
    """The ``wanted`` checks as each finishes, then with ``environments`` one per NEMO_GYM_ENVS server named;
    one whose need did not pass is SKIP, ``needs <what it gives>``."""
    chosen = [_WANTED[key] for key in wanted]
    if environments and isinstance(target.settings, Settings):
        named = None if environments is True else set(environments)
        chosen += [
            Check(f"environment {name}", partial(_environment, name), (_SETTINGS,))
            for name in target.settings.environments
            if named is None or name in named
        ]
    done: dict[str, CheckResult] = {}
    for check in chosen:
        need = next((need for need in check.needs if need.name in done and not done[need.name].ok), None)
        if need is None:
            result = CheckResult(check.name, *check.test(target))
        else:
            blocked = done[need.name]
            why = blocked.detail if blocked.status is Status.skipped else f"needs {need.gives}"
            result = CheckResult(check.name, Status.skipped, why)
        done[check.name] = result
        yield result
