"""Is a URL a ``mini_swe_agent_2`` server whose ``POST /run`` takes ``policy_base_url``, or a
resources server with the routes an environment's rows need?

The one server check behind ``doctor``, the launcher's checks and ``scan``: fetch
``/openapi.json`` through the one transport (``transport.request``: one deadline for the whole
answer, no redirects, a size cap), read
``POST /run``'s body fields with a bounded schema walk, or a resources server's ``POST``
routes, and say what a failure means and how to fix it. Why each guard exists:
docs/data-and-checks.md.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from miles_nemogym import failure_kinds as fk
from miles_nemogym import pins
from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.redaction import redact_url
from miles_nemogym.transport import Deadline, TransportError, pool, request


class FetchError(MilesNemoGymError, Exception):
    """The URL could not be fetched as JSON; ``kind`` says why in one word."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


Fetcher = Callable[[str, float], Any]
"""``fetch(url, timeout_s) -> parsed JSON``; raises ``FetchError``."""


_MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""An OpenAPI document larger than this is not a NeMo-Gym server's."""
_MAX_SCHEMA_NODES = 10_000
"""Most schema objects read while collecting ``/run``'s fields (``$ref``/``allOf`` walk)."""
_MAX_REF_HOPS = 64


def _parse_json(body: bytes) -> Any:
    """``body`` as JSON; raises ``FetchError("not-json")`` (also for absurd nesting)."""
    try:
        return json.loads(body)
    except ValueError:
        raise FetchError("not-json", "the answer is not JSON") from None
    except RecursionError:
        raise FetchError("not-json", "the answer is JSON nested too deeply to be an OpenAPI document") from None


async def _fetch_json_async(url: str, timeout_s: float) -> Any:
    """GET ``url`` and parse its JSON body through the one transport (one deadline for connect,
    headers and the whole body, no redirects, at most ``_MAX_DOCUMENT_BYTES``); raises ``FetchError``."""
    connections = await pool(1)
    try:
        answer = await request(
            connections.gym,
            "GET",
            url,
            deadline=Deadline(timeout_s),
            connect_timeout_s=timeout_s,
            cap=_MAX_DOCUMENT_BYTES,
        )
    except TransportError as error:
        raise _fetch_error(error, timeout_s) from None
    if 300 <= answer.status < 400:
        target = redact_url(answer.location or "?")
        raise FetchError("redirect", f"HTTP {answer.status} redirect to {target} (not followed)")
    if answer.status != 200:
        raise FetchError("http", f"HTTP {answer.status}")
    if answer.over_cap:
        raise FetchError(
            "too-large", f"the answer is over {_MAX_DOCUMENT_BYTES // (1024 * 1024)} MB, not an OpenAPI document"
        )
    return _parse_json(answer.body)


def _fetch_error(error: TransportError, timeout_s: float) -> FetchError:
    """The transport's failure in the words of a server check (each word has its fix below)."""
    cause = error.os_error
    if error.kind == fk.TRANSPORT_TLS:
        if isinstance(cause, aiohttp.ClientConnectorCertificateError):
            reason = getattr(cause.certificate_error, "verify_message", "") or str(cause.certificate_error)
            return FetchError("certificate", f"the server's TLS certificate failed verification ({reason})")
        return FetchError("tls", f"the TLS handshake failed ({error})")
    if error.kind == fk.TRANSPORT_UNREACHABLE:
        if isinstance(cause, socket.gaierror):
            return FetchError("dns", f"host name does not resolve ({cause})")
        if isinstance(cause, ConnectionRefusedError):
            return FetchError("refused", "connection refused (nothing listens on that port)")
        return FetchError("connect", str(error))
    if error.kind in (fk.AGENT_TIMEOUT, fk.TRANSPORT_TIMEOUT):
        return FetchError("timeout", f"no complete answer within {timeout_s:g} s")
    return FetchError("connect", str(error))


def fetch_json(url: str, timeout_s: float) -> Any:
    """Blocking :func:`_fetch_json_async` (doctor and the launcher run outside an event loop)."""
    return asyncio.run(_fetch_json_async(url, timeout_s))


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
        if ref in seen or len(seen) >= _MAX_REF_HOPS:
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
        if len(visited) > _MAX_SCHEMA_NODES:
            raise SchemaError(f"the /run body schema spans over {_MAX_SCHEMA_NODES} schema objects")
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


# --- a resources server's routes ---------------------------------------------------------

_ANY_NAME = re.compile(r"^/\{[^/{}]+\}$")
"""A path of one parameter (``/{tool_name}``): FastAPI routes every tool name there."""
RESOURCES_ROUTES = ("/seed_session", "/verify")
"""What every episode of a resources-server environment calls besides its tools."""


@dataclass(frozen=True)
class ResourcesRoutes:
    """The ``POST`` routes a resources server's OpenAPI document declares."""

    paths: frozenset[str]

    @property
    def any_tool(self) -> str | None:
        """The catch-all route (``/{tool_name}``) that takes every tool's calls, if declared."""
        return next((path for path in sorted(self.paths) if _ANY_NAME.match(path)), None)

    def missing_routes(self) -> list[str]:
        """Of ``/seed_session`` and ``/verify``, those not declared."""
        return [path for path in RESOURCES_ROUTES if path not in self.paths]

    def unserved_tools(self, tools: Iterable[str]) -> list[str]:
        """The tools (by name) whose calls no declared route takes, sorted."""
        if self.any_tool is not None:
            return []
        return sorted({tool for tool in tools if f"/{tool}" not in self.paths})


def resources_routes(openapi: Any) -> ResourcesRoutes:
    """The ``POST`` paths of a fetched OpenAPI document; raises only ``SchemaError``."""
    if not isinstance(openapi, Mapping) or not isinstance(openapi.get("paths"), Mapping):
        raise SchemaError("the document is not an OpenAPI schema (no 'paths')")
    posts = (str(path) for path, item in openapi["paths"].items() if isinstance(item, Mapping) and "post" in item)
    return ResourcesRoutes(frozenset(posts))


# --- what a failure means ----------------------------------------------------------------

_WRONG_SERVER_FIX = (
    "NEMO_GYM_URL must be the mini_swe_agent_2 agent server's own address (the port "
    "in its config, e.g. 12000; its /openapi.json lists POST /run), not the Gym head server or a model server"
)
_FIXES = {
    "redirect": "NEMO_GYM_URL must be the mini_swe_agent_2 server's own address: a redirect "
    "is not followed, since the trainer's /run calls are not either",
    "http": _WRONG_SERVER_FIX,
    "not-json": _WRONG_SERVER_FIX,
    "too-large": _WRONG_SERVER_FIX,
    "schema": _WRONG_SERVER_FIX,
    "certificate": "make this machine trust the server's certificate: set SSL_CERT_FILE to a PEM file holding "
    "the CA that signed it (or add that CA to the system's trust store), and name the host the certificate "
    "is issued for; or use http:// if the server does not serve TLS",
    "tls": "use http:// if the server does not serve TLS (https:// only for a server that does)",
}
_UNREACHABLE_FIX = (
    "start the server (`miles-nemogym serve`, or `gym env start` with the mini_swe_agent_2 config) "
    "and set NEMO_GYM_URL to its http://host:port; check that no firewall blocks "
    "that port from this machine"
)
_NO_POLICY_FIELD_FIX = (
    f"run nemo-gym {pins.NEMO_GYM_VERSION} (the version this package is tested with) or any release "
    "whose mini_swe_agent_2 /run takes policy_base_url"
)


@dataclass(frozen=True)
class ServerProblem:
    """Why the server cannot take the trainer's episodes: what was seen, and the fix."""

    stage: str
    """``fetch`` (no usable answer), ``schema`` (no ``POST /run``) or ``policy-field``."""
    detail: str
    fix: str

    def __str__(self) -> str:
        return f"{self.detail}; {self.fix}"


@dataclass(frozen=True)
class RunEndpoint:
    """``POST /run`` as the server's OpenAPI document declares it."""

    body_name: str
    fields: frozenset[str]

    @property
    def takes_policy_url(self) -> bool:
        return "policy_base_url" in self.fields


def _fetch_problem(gym_url: str, error: FetchError) -> ServerProblem:
    """What a failed ``/openapi.json`` fetch means (URLs shown with their password hidden)."""
    detail = f"GET {redact_url(gym_url)}/openapi.json: {error}"
    return ServerProblem("fetch", detail, _FIXES.get(error.kind, _UNREACHABLE_FIX))


def _read_run_endpoint(gym_url: str, document: Any) -> RunEndpoint | ServerProblem:
    """``POST /run``'s body from a fetched document, or why the document has none."""
    try:
        name, fields = run_body_fields(document)
    except SchemaError as error:
        detail = f"{redact_url(gym_url)} answers but does not offer POST /run ({error})"
        return ServerProblem("schema", detail, _FIXES["schema"])
    return RunEndpoint(name, frozenset(fields))


def policy_field_problem(gym_url: str, endpoint: RunEndpoint) -> ServerProblem | None:
    """None when ``/run`` declares ``policy_base_url``; else why an older server would mislead."""
    if endpoint.takes_policy_url:
        return None
    return ServerProblem(
        "policy-field",
        f"{redact_url(gym_url)}: the /run body ({endpoint.body_name}) declares no policy_base_url, so this "
        "server would ignore the trainer's policy URL and run every episode on its own configured model",
        _NO_POLICY_FIELD_FIX,
    )


def probe(gym_url: str, timeout_s: float, fetch: Fetcher = fetch_json) -> RunEndpoint | ServerProblem:
    """Fetch and read ``<gym_url>/openapi.json`` (blocking; ``fetch`` is replaceable for tests)."""
    try:
        document = fetch(f"{gym_url}/openapi.json", timeout_s)
    except FetchError as error:
        return _fetch_problem(gym_url, error)
    return _read_run_endpoint(gym_url, document)


async def _probe_async(gym_url: str, timeout_s: float) -> RunEndpoint | ServerProblem:
    """:func:`probe` inside a running event loop (the scan)."""
    try:
        document = await _fetch_json_async(f"{gym_url}/openapi.json", timeout_s)
    except FetchError as error:
        return _fetch_problem(gym_url, error)
    return _read_run_endpoint(gym_url, document)


_NO_ANSWER = frozenset({"timeout", "dns", "refused", "connect", "certificate", "tls"})
"""Fetch failures that mean no HTTP answer at all (any status code is an answer)."""


async def policy_problem(policy_base_url: str, timeout_s: float) -> ServerProblem | None:
    """None when ``GET <policy_base_url>/models`` gets any HTTP answer from this machine (no
    key is sent: a 401 counts), else why not and the fix; an episode would only wait on it."""
    try:
        await _fetch_json_async(f"{policy_base_url}/models", timeout_s)
    except FetchError as error:
        if error.kind in _NO_ANSWER:
            return ServerProblem(
                "policy",
                f"the policy endpoint does not answer: GET {redact_url(policy_base_url)}/models: {error}",
                "start the policy server or correct --policy-base-url (an OpenAI-compatible API "
                "ending in /v1, reachable from this machine and the Gym server's)",
            )
    return None


class ServerCheckError(MilesNemoGymError, RuntimeError):
    """The server did not answer, or cannot run this scan; the message says why and the fix."""


async def check_server(gym_url: str, timeout_s: float, *, policy_base_url: str | None = None) -> None:
    """Raise ``ServerCheckError`` unless ``gym_url`` serves a usable ``POST /run`` and, when
    given, ``/run`` takes ``policy_base_url`` and that policy answers (the scan's gate)."""
    found = await _probe_async(gym_url, timeout_s)
    if not isinstance(found, RunEndpoint):
        raise ServerCheckError(str(found))
    if policy_base_url is None:
        return
    problem = policy_field_problem(gym_url, found)
    if problem is not None:
        raise ServerCheckError(f"{problem}, or scan a golden server with --golden")
    problem = await policy_problem(policy_base_url, timeout_s)
    if problem is not None:
        raise ServerCheckError(str(problem))
