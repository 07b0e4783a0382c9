"""What a server's ``/openapi.json`` declares: ``POST /run``'s body fields, or a resources server's routes."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from miles_nemogym.errors import (
    AGENT_TIMEOUT,
    TRANSPORT_TIMEOUT,
    TRANSPORT_TLS,
    TRANSPORT_UNREACHABLE,
    Failed,
    MilesNemoGymError,
    redact_url,
)
from miles_nemogym.transport import get

__all__ = [
    "FetchError",
    "Fetcher",
    "Identifier",
    "SchemaError",
    "ServerIdentity",
    "fetch_json",
    "identify",
    "resources_routes",
    "run_body_fields",
]


class FetchError(MilesNemoGymError, Exception):
    """The URL could not be fetched as JSON; ``kind`` says why in one word."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


_T = TypeVar("_T")
Fetcher = Callable[[str, float], Any]
"""``fetch(url, timeout_s) -> parsed JSON``; raises ``FetchError``."""


_MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""An OpenAPI document larger than this is not a NeMo-Gym server's."""
_MAX_SCHEMA_NODES = 10_000
"""Most schema objects read while collecting ``/run``'s fields (``$ref``/``allOf`` walk)."""
_MAX_REF_HOPS = 64


def _blocking(call: Coroutine[Any, Any, _T], timeout_s: float) -> _T:
    """Run one transport call (the checks run outside an event loop); its failure as a ``FetchError``."""
    try:
        return asyncio.run(call)
    except Failed as error:
        raise _fetch_error(error, timeout_s) from None


def fetch_json(url: str, timeout_s: float) -> Any:
    """GET ``url`` through the one transport (one deadline, no redirects, at most ``_MAX_DOCUMENT_BYTES``) as JSON."""
    answer = _blocking(get(url, timeout_s, _MAX_DOCUMENT_BYTES), timeout_s)
    if 300 <= answer.status < 400:
        target = redact_url(answer.location or "?")
        raise FetchError("redirect", f"HTTP {answer.status} redirect to {target} (not followed)")
    if answer.status != 200:
        raise FetchError("http", f"HTTP {answer.status}")
    if answer.over_cap:
        raise FetchError(
            "too-large", f"the answer is over {_MAX_DOCUMENT_BYTES // (1024 * 1024)} MB, not an OpenAPI document"
        )
    try:
        return json.loads(answer.body)
    except ValueError:
        raise FetchError("not-json", "the answer is not JSON") from None
    except RecursionError:
        raise FetchError("not-json", "the answer is JSON nested too deeply to be an OpenAPI document") from None


def _fetch_error(error: Failed, timeout_s: float) -> FetchError:
    """The transport's failure in the words of a server check (each kind has its fix in ``checks``)."""
    cause = error.os_error
    if error.kind == TRANSPORT_TLS:
        if isinstance(cause, aiohttp.ClientConnectorCertificateError):
            reason = getattr(cause.certificate_error, "verify_message", "") or str(cause.certificate_error)
            return FetchError("certificate", f"the server's TLS certificate failed verification ({reason})")
        return FetchError("tls", f"the TLS handshake failed ({error})")
    if error.kind == TRANSPORT_UNREACHABLE:
        if isinstance(cause, socket.gaierror):
            return FetchError("dns", f"host name does not resolve ({cause})")
        if isinstance(cause, ConnectionRefusedError):
            return FetchError("refused", "connection refused (nothing listens on that port)")
    if error.kind in (AGENT_TIMEOUT, TRANSPORT_TIMEOUT):
        return FetchError("timeout", f"no complete answer within {timeout_s:g} s")
    return FetchError("connect", str(error))


_IDENTITY_SEPARATOR = "___"
"""NeMo-Gym servers set a ``<ServerClass>___<instance>`` session cookie on every answer (get_session_middleware_key)."""


@dataclass(frozen=True)
class ServerIdentity:
    """What a NeMo-Gym server calls itself: its class and its config instance name."""

    server_class: str
    instance: str

    def __str__(self) -> str:
        return f"{self.instance} ({self.server_class})"


Identifier = Callable[[str, float], "ServerIdentity | None"]
"""``identify(url, timeout_s) -> ServerIdentity | None``; raises ``FetchError``."""


def identify(url: str, timeout_s: float) -> ServerIdentity | None:
    """The NeMo-Gym server answering ``GET url``, by its session cookie's name; None when none names it."""
    for name in _blocking(get(url, timeout_s, cap=0), timeout_s).cookies:
        server_class, separator, instance = name.partition(_IDENTITY_SEPARATOR)
        if separator and server_class and instance:
            return ServerIdentity(server_class, instance)
    return None


class SchemaError(MilesNemoGymError, ValueError):
    """The OpenAPI document does not describe a usable ``POST /run``."""


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
        schema = document
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(schema, Mapping) or part not in schema:
                raise SchemaError(f"the /run body schema's $ref {ref!r} does not resolve")
            schema = schema[part]


def _properties(document: Mapping[str, Any], schema: Mapping[str, Any]) -> set[str]:
    """Property names of a schema, through ``allOf`` (how subclassed models may render)."""
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


def _paths(openapi: Any) -> Mapping[str, Any]:
    paths = openapi.get("paths") if isinstance(openapi, Mapping) else None
    if not isinstance(paths, Mapping):
        raise SchemaError("the document is not an OpenAPI schema (no 'paths')")
    return paths


def run_body_fields(openapi: Any) -> tuple[str, set[str]]:
    """The name of ``POST /run``'s JSON body schema and the fields it declares."""
    post = _object(_paths(openapi).get("/run"), "the document's '/run' entry").get("post")
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


_ANY_NAME = re.compile(r"^/\{[^/{}]+\}$")
"""A path of one parameter (``/{tool_name}``): FastAPI routes every tool name there."""


def resources_routes(openapi: Any) -> tuple[frozenset[str], str | None]:
    """The ``POST`` paths of a fetched OpenAPI document, and the one taking every tool's calls (``/{tool_name}``)
    if it declares one; raises only ``SchemaError``."""
    posts = frozenset(
        str(path) for path, item in _paths(openapi).items() if isinstance(item, Mapping) and "post" in item
    )
    return posts, next((path for path in sorted(posts) if _ANY_NAME.match(path)), None)
