"""A NeMo-Gym server's FastAPI ``/openapi.json``, and a loopback stand-in serving it.

The document is shaped like the one FastAPI generates for nemo-gym's ``mini_swe_agent_2``
app (``$ref`` to a component schema, optional fields as ``anyOf``). Registered as a pytest
plugin in ``tests/conftest.py`` so every test module gets the ``gym`` fixture.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
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


class GymStandIn:
    """A loopback HTTP server whose ``/openapi.json`` answer the test sets."""

    def __init__(self) -> None:
        self.status = 200
        self.body: bytes = json.dumps(openapi_document()).encode()
        self.requests: list[str] = []
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
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def serve(self, document: Any) -> None:
        self.body = json.dumps(document).encode()


@pytest.fixture
def gym() -> Iterator[GymStandIn]:
    """A started ``GymStandIn`` serving ``openapi_document()``; stopped after the test."""
    stand_in = GymStandIn()
    stand_in.thread.start()
    try:
        yield stand_in
    finally:
        stand_in.server.shutdown()
        stand_in.server.server_close()
