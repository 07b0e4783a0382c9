"""Fast preflight of a NeMo-Gym deployment: would the agent function's ``/run`` calls work?

Serves ``miles-nemogym doctor`` and the launcher's preflight. In seconds, before any GPU time is spent, it checks that:

1. the plugin's environment variables are valid (``miles_nemogym.settings``);
2. ``NEMO_GYM_URL`` answers;
3. the server's ``POST /run`` declares ``policy_base_url`` in its request body. The body
   model keeps unknown keys, so an older server would accept the field *and ignore it*,
   silently sending every episode to its own configured model instead of the trainer —
   only the server's OpenAPI schema (it is a FastAPI app) tells the two apart;
4. the policy host the agent function would send is dialable from the Gym host: not a
   wildcard or loopback address when the server runs on another machine.

``run_checks`` holds the logic; the only I/O is the ``fetch`` callable it is given
(default: ``fetch_json``, one deadline for the whole answer, no redirects, a size cap)
and the environment it reads the settings from, so the launcher can reuse it and tests can
point it anywhere. Whatever the server sends, each check ends as one PASS/FAIL line:
a hostile or broken OpenAPI document is a ``SchemaError``, never a crash or a hang.
URLs are shown with their password hidden (``redaction.redact_url``).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from miles_nemogym import pins
from miles_nemogym.episode.policy_url import PolicyUrlError, is_loopback, is_wildcard, policy_base_url
from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.redaction import redact_url, redact_urls
from miles_nemogym.settings import Settings, SettingsError

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_SESSION_HOST = "0.0.0.0"
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


class FetchError(MilesNemoGymError, Exception):
    """The URL could not be fetched as JSON; ``kind`` says why in one word."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


Fetcher = Callable[[str, float], Any]
"""``fetch(url, timeout_s) -> parsed JSON``; raises ``FetchError``."""


MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""An OpenAPI document larger than this is not a NeMo-Gym server's (theirs are ~100 KB)."""
MAX_SCHEMA_NODES = 10_000
"""Most schema objects read while collecting ``/run``'s fields (``$ref``/``allOf`` walk)."""
MAX_REF_HOPS = 64


def parse_json(body: bytes) -> Any:
    """``body`` as JSON; raises ``FetchError("not-json")`` (also for absurd nesting)."""
    try:
        return json.loads(body)
    except ValueError:
        raise FetchError("not-json", "the answer is not JSON") from None
    except RecursionError:
        raise FetchError("not-json", "the answer is JSON nested too deeply to be an OpenAPI document") from None


async def fetch_json_async(url: str, timeout_s: float) -> Any:
    """GET ``url`` and parse its JSON body, all of it within ``timeout_s``.

    The deadline covers connecting, the headers and the whole body (a server trickling
    bytes cannot stretch it), redirects are not followed (a redirect to another server
    must not pass for this one), and a body over ``MAX_DOCUMENT_BYTES`` is refused.
    """
    import aiohttp

    try:
        async with (
            # trust_env=False: proxies from the environment would turn "unreachable" into a proxy's page.
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s), trust_env=False) as session,
            session.get(url, allow_redirects=False, headers={"Accept": "application/json"}) as response,
        ):
            if 300 <= response.status < 400:
                target = redact_url(response.headers.get("Location", "?"))
                raise FetchError("redirect", f"HTTP {response.status} redirect to {target} (not followed)")
            if response.status != 200:
                raise FetchError("http", f"HTTP {response.status} {response.reason or ''}".rstrip())
            body = bytearray()
            async for chunk in response.content.iter_any():
                body += chunk
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise FetchError(
                        "too-large",
                        f"the answer is over {MAX_DOCUMENT_BYTES // (1024 * 1024)} MB, not an OpenAPI document",
                    )
    except (asyncio.TimeoutError, TimeoutError):
        raise FetchError("timeout", f"no complete answer within {timeout_s:g} s") from None
    except aiohttp.ClientConnectorError as error:
        if isinstance(error.os_error, socket.gaierror):
            raise FetchError("dns", f"host name does not resolve ({error.os_error})") from None
        if isinstance(error.os_error, ConnectionRefusedError):
            raise FetchError("refused", "connection refused (nothing listens on that port)") from None
        raise FetchError("connect", str(error.os_error)) from None
    except (aiohttp.ClientError, OSError, ValueError) as error:
        raise FetchError("connect", f"{type(error).__name__}: {error}") from None
    return parse_json(bytes(body))


def fetch_json(url: str, timeout_s: float) -> Any:
    """Blocking :func:`fetch_json_async` (doctor and the launcher run outside an event loop)."""
    return asyncio.run(fetch_json_async(url, timeout_s))


# --- the OpenAPI schema ------------------------------------------------------------------


class SchemaError(MilesNemoGymError, ValueError):
    """The OpenAPI document does not describe a usable ``POST /run``."""


def _lookup(document: Mapping[str, Any], ref: str) -> Any:
    target: Any = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, Mapping) or part not in target:
            raise SchemaError(f"the /run body schema's $ref {ref!r} does not resolve")
        target = target[part]
    return target


def _resolve(document: Mapping[str, Any], schema: Any) -> Mapping[str, Any]:
    """Follow local ``$ref`` pointers (``#/components/schemas/X``) to a schema object."""
    seen: set[str] = set()
    while True:
        if not isinstance(schema, Mapping):
            raise SchemaError(f"the /run body schema holds a {type(schema).__name__} where a schema object belongs")
        ref = schema.get("$ref")
        if ref is None:
            return schema
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise SchemaError(f"the /run body schema points outside the document ({str(ref)[:80]!r})")
        if ref in seen or len(seen) >= MAX_REF_HOPS:
            raise SchemaError("the /run body schema's $ref chain does not end")
        seen.add(ref)
        schema = _lookup(document, ref)


def _properties(document: Mapping[str, Any], schema: Mapping[str, Any]) -> set[str]:
    """Property names of a schema, through ``allOf`` (how subclassed models may render).

    Iterative, each schema object read once: an ``allOf`` that includes itself, or a
    document nested thousands deep, ends with a clear ``SchemaError`` in milliseconds.
    """
    names: set[str] = set()
    pending: list[Any] = [schema]
    visited: set[int] = set()
    while pending:
        node = _resolve(document, pending.pop())
        if id(node) in visited:
            continue
        visited.add(id(node))
        if len(visited) > MAX_SCHEMA_NODES:
            raise SchemaError(f"the /run body schema spans over {MAX_SCHEMA_NODES} schema objects")
        properties = node.get("properties") or {}
        if not isinstance(properties, Mapping):
            raise SchemaError(f"the /run body schema's 'properties' is a {type(properties).__name__}, not an object")
        names.update(str(name) for name in properties)
        parts = node.get("allOf") or []
        if not isinstance(parts, list):
            raise SchemaError(f"the /run body schema's 'allOf' is a {type(parts).__name__}, not a list")
        pending.extend(parts)
    return names


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SchemaError(f"{what} is a {type(value).__name__}, not an object")
    return value


def run_body_fields(openapi: Any) -> tuple[str, set[str]]:
    """The name of ``POST /run``'s JSON body schema and the fields it declares.

    Raises only ``SchemaError``, whatever the document holds.
    """
    if not isinstance(openapi, Mapping) or not isinstance(openapi.get("paths"), Mapping):
        raise SchemaError("the document is not an OpenAPI schema (no 'paths')")
    post = _object(openapi["paths"].get("/run"), "the document's '/run' entry").get("post")
    if post is None:
        raise SchemaError("the server has no POST /run")
    operation = _object(post, "POST /run")
    content = _object(_object(operation.get("requestBody"), "POST /run's requestBody").get("content"), "its content")
    media = _object(content.get("application/json"), "its application/json entry")
    if "schema" not in media:
        raise SchemaError("POST /run declares no JSON request body")
    raw = media["schema"]
    name = str(raw.get("$ref", "")).rsplit("/", 1)[-1] if isinstance(raw, Mapping) else ""
    schema = _resolve(openapi, raw)
    return name or str(schema.get("title", "<inline>"))[:80], _properties(openapi, schema)


# --- the checks --------------------------------------------------------------------------

_CHECK_SETTINGS = "settings"
_CHECK_REACHABLE = "NeMo-Gym answers"
_CHECK_POLICY_FIELD = "/run accepts policy_base_url"
_CHECK_POLICY_HOST = "policy host dialable from the Gym host"


def _check_settings(environ: Mapping[str, str]) -> tuple[CheckResult, Settings | None]:
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
    note = "" if "NEMO_GYM_URL" in environ else " (NEMO_GYM_URL unset: the default)"
    return (
        CheckResult(_CHECK_SETTINGS, Status.passed, f"NeMo-Gym server {redact_url(settings.gym_url)}{note}"),
        settings,
    )


def _check_reachable(gym_url: str, fetch: Fetcher, timeout_s: float) -> tuple[CheckResult, Any]:
    url = f"{gym_url}/openapi.json"
    shown = redact_url(url)
    try:
        document = fetch(url, timeout_s)
    except FetchError as error:
        if error.kind == "redirect":
            fix = (
                "NEMO_GYM_URL must be the mini_swe_agent_2 server's own address: a redirect is not "
                "followed, since the trainer's /run calls are not either"
            )
        elif error.kind == "http":
            fix = (
                "NEMO_GYM_URL must be the mini_swe_agent_2 agent server's own address (the port in "
                "its config, e.g. 12000), not the Gym head server or a model server"
            )
        elif error.kind in ("not-json", "too-large"):
            fix = "NEMO_GYM_URL points at something that is not a NeMo-Gym (FastAPI) server"
        else:
            fix = (
                "start the server (`miles-nemogym serve`, or `gym env start` with the "
                "mini_swe_agent_2 config) and set NEMO_GYM_URL to its http://host:port; check that "
                "no firewall blocks that port from this machine"
            )
        return CheckResult(_CHECK_REACHABLE, Status.failed, f"GET {shown}: {error}", fix), None
    return CheckResult(_CHECK_REACHABLE, Status.passed, f"GET {shown}: OpenAPI schema received"), document


def _check_policy_field(document: Any) -> CheckResult:
    try:
        name, fields = run_body_fields(document)
    except SchemaError as error:
        return CheckResult(
            _CHECK_POLICY_FIELD,
            Status.failed,
            str(error),
            "NEMO_GYM_URL must be the mini_swe_agent_2 agent server (the one that serves POST /run "
            "for SWE-bench instances), not another Gym server",
        )
    if "policy_base_url" not in fields:
        return CheckResult(
            _CHECK_POLICY_FIELD,
            Status.failed,
            f"the /run body ({name}) has no policy_base_url field: this server would ignore the "
            "trainer's policy URL and send every episode to its own configured model",
            f"run nemo-gym {pins.NEMO_GYM_VERSION} (the version this package is tested with) or any "
            "release whose mini_swe_agent_2 /run takes policy_base_url",
        )
    return CheckResult(_CHECK_POLICY_FIELD, Status.passed, f"the /run body ({name}) declares policy_base_url")


def _check_policy_host(settings: Settings, session_host: str) -> CheckResult:
    gym_host = urlsplit(settings.gym_url).hostname or ""
    session_url = f"http://{_bracket(session_host)}:30000/sessions/doctor"
    try:
        url = policy_base_url(session_url, settings.gym_url, settings.external_host)
    except PolicyUrlError as error:
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


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def run_checks(
    *,
    session_host: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    fetch: Fetcher = fetch_json,
    environ: Mapping[str, str] | None = None,
) -> list[CheckResult]:
    """Every doctor check, in order; a check whose prerequisite failed is ``skipped``.

    ``session_host`` is the ``--session-server-ip`` the trainer will use (default
    ``0.0.0.0``, the recipe's); the settings are read from ``environ`` (default: this process's).
    """
    host = (session_host or DEFAULT_SESSION_HOST).strip()
    results: list[CheckResult] = []
    settings_result, settings = _check_settings(os.environ if environ is None else environ)
    results.append(settings_result)
    if settings is None:
        reason = "needs valid settings"
        results += [
            CheckResult(name, Status.skipped, reason)
            for name in (_CHECK_REACHABLE, _CHECK_POLICY_FIELD, _CHECK_POLICY_HOST)
        ]
        return results
    reachable, document = _check_reachable(settings.gym_url, fetch, timeout_s)
    results.append(reachable)
    if reachable.ok:
        results.append(_check_policy_field(document))
    else:
        results.append(CheckResult(_CHECK_POLICY_FIELD, Status.skipped, "needs the server's answer"))
    results.append(_check_policy_host(settings, host))
    return results


def all_passed(results: list[CheckResult]) -> bool:
    return bool(results) and all(result.ok for result in results)
