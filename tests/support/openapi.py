"""A NeMo-Gym server's FastAPI ``/openapi.json``, and a loopback stand-in serving it.

The documents are shaped like the ones FastAPI generates for nemo-gym's ``mini_swe_agent_2``
app (``$ref`` to a component schema, optional fields as ``anyOf``) and for a resources
server (``SimpleResourcesServer``'s routes plus one ``POST /<tool>`` each, or a catch-all
``POST /{tool_name}`` as ``workplace_assistant`` declares). Registered as a pytest plugin in
``tests/conftest.py`` so every test module gets the ``gym`` fixture.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


def openapi_document(*, with_policy_field: bool = True, with_run: bool = True) -> dict[str, Any]:
    """The agent server's schema; without the routing fields (older nemo-gym) or without ``POST /run``."""
    properties: dict[str, Any] = {
        "responses_create_params": {"$ref": "#/components/schemas/ResponsesCreateParams"},
        "instance_id": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Instance Id"},
    }
    if with_policy_field:
        properties["policy_base_url"] = {"anyOf": [{"type": "string"}, {"type": "null"}]}
        properties["policy_api_key"] = {"anyOf": [{"type": "string"}, {"type": "null"}]}
    paths: dict[str, Any] = {
        "/v1/responses": {"post": {"responses": {"200": {"description": "ok"}}}},
        "/aggregate_metrics": {"post": {"responses": {"200": {"description": "ok"}}}},
    }
    if with_run:
        paths["/run"] = {
            "post": {
                "summary": "Run With Rollout Context",
                "requestBody": {
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/MiniSWEAgentRunRequest"}}
                    },
                    "required": True,
                },
                "responses": {"200": {"description": "Successful Response"}},
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "FastAPI", "version": "0.1.0"},
        "paths": paths,
        "components": {
            "schemas": {
                "MiniSWEAgentRunRequest": {
                    "additionalProperties": True,
                    "properties": properties,
                    "required": ["responses_create_params"],
                    "title": "MiniSWEAgentRunRequest",
                    "type": "object",
                },
                "ResponsesCreateParams": {"type": "object", "properties": {"input": {}}},
            }
        },
    }


def _post(summary: str, body: str | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "responses": {"200": {"description": "Successful Response"}}}
    if body is not None:
        schema = {"$ref": f"#/components/schemas/{body}"}
        operation["requestBody"] = {"content": {"application/json": {"schema": schema}}, "required": True}
    return {"post": operation}


def resources_document(
    tools: Iterable[str] = (),
    *,
    any_tool: bool = False,
    routes: Iterable[str] = ("/seed_session", "/verify"),
) -> dict[str, Any]:
    """A resources server's schema: ``routes`` (of ``/seed_session`` and ``/verify``), the
    other routes every one declares, a ``POST /<tool>`` per tool, and ``POST /{tool_name}`` with ``any_tool``."""
    paths: dict[str, Any] = {
        "/close_session": _post("Close Resources Session"),
        "/aggregate_metrics": _post("Aggregate Metrics", "AggregateMetricsRequest"),
        "/reverify_mode": {"get": {"summary": "Get Reverify Mode", "responses": {"200": {"description": "ok"}}}},
    }
    if "/seed_session" in routes:
        paths["/seed_session"] = _post("Seed Session", "BaseSeedSessionRequest")
    if "/verify" in routes:
        paths["/verify"] = _post("Verify", "BaseVerifyRequest")
    for tool in tools:
        paths[f"/{tool}"] = _post(tool.replace("_", " ").title(), "ToolRequest")
    if any_tool:
        paths["/{tool_name}"] = {
            "post": {
                **_post("Route Tool Call")["post"],
                "parameters": [{"name": "tool_name", "in": "path", "required": True, "schema": {"type": "string"}}],
            }
        }
    schemas = {name: {"type": "object", "title": name, "properties": {}} for name in (
        "AggregateMetricsRequest", "BaseSeedSessionRequest", "BaseVerifyRequest", "ToolRequest")}  # fmt: skip
    return {"openapi": "3.1.0", "info": {"title": "FastAPI", "version": "0.1.0"}, "paths": paths,
            "components": {"schemas": schemas}}  # fmt: skip


class GymStandIn:
    """A loopback HTTP server whose ``/openapi.json`` answer the test sets."""

    def __init__(self) -> None:
        self.status = 200
        self.body: bytes = json.dumps(openapi_document()).encode()
        self.requests: list[str] = []
        self.server_name: str | None = None
        """Set: every answer sets the session cookie a NeMo-Gym server names ``<Class>___<instance>``."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append(self.path)
                if self.path != "/openapi.json":
                    self.send_error(404)
                    return
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(outer.body)))
                if outer.server_name is not None:
                    self.send_header("Set-Cookie", f"{outer.server_name}=eyJzZXNzaW9uIjoiMSJ9; path=/; httponly")
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def serve(self, document: Any) -> None:
        self.body = json.dumps(document).encode()


@contextlib.contextmanager
def serving(document: Any = None) -> Iterator[GymStandIn]:
    """A started ``GymStandIn`` serving ``document`` (default ``openapi_document()``), stopped after."""
    stand_in = GymStandIn()
    if document is not None:
        stand_in.serve(document)
    stand_in.thread.start()
    try:
        yield stand_in
    finally:
        stand_in.server.shutdown()
        stand_in.server.server_close()


@pytest.fixture
def gym() -> Iterator[GymStandIn]:
    """A started ``GymStandIn`` serving ``openapi_document()``; stopped after the test."""
    with serving() as stand_in:
        yield stand_in
