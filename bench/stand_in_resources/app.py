"""A fast stand-in NeMo-Gym resources server for ``simple_agent_bench.py``: the real contract, minimal work.

Started as NeMo-Gym starts a resources server: ``NEMO_GYM_CONFIG_DICT`` holds the composed
config (YAML), ``NEMO_GYM_CONFIG_PATH`` this server's name in it, whose entry gives host and
port. Its config entry (written by the benchmark) registers it as a resources server, so a
NeMo-Gym ``simple_agent`` can be pointed at it like at any environment.

- ``POST /seed_session``: the task row; sets a fresh ``session`` cookie, answers ``{}``.
- ``POST /<tool>``: needs a seeded session's cookie (else HTTP 400, as a real server without
  state fails); answers a short JSON string naming the tool.
- ``POST /verify``: the row plus ``response``, with the session's cookie; reward 1.0 when the
  session's tools were called and a ``function_call`` item equals the row's first
  ``ground_truth`` call (``workplace_assistant``'s rule, simplified), else 0.0; answers the
  request with ``reward`` added, as NeMo-Gym's ``BaseVerifyResponse`` does. A reward of 1.0
  so shows the client carried the cookie on every call.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import yaml
from aiohttp import web

_COOKIE = "session"


def _reward(body: dict[str, Any]) -> float:
    gold = (body.get("ground_truth") or [{}])[0]
    for item in body.get("response", {}).get("output", []):
        if (
            item.get("type") == "function_call"
            and item.get("name") == gold.get("name")
            and json.loads(item.get("arguments") or "null") == json.loads(gold.get("arguments") or "null")
        ):
            return 1.0
    return 0.0


def app() -> web.Application:
    sessions: dict[str, int] = {}  # session -> tool calls made in it
    ids = itertools.count()

    async def seed(request: web.Request) -> web.Response:
        await request.json()
        session = f"s{next(ids)}"
        sessions[session] = 0
        response = web.json_response({})
        response.set_cookie(_COOKIE, session, path="/", httponly=True, samesite="lax")
        return response

    async def verify(request: web.Request) -> web.Response:
        body = await request.json()
        if request.cookies.get(_COOKIE) not in sessions:
            return web.json_response({"detail": "no seeded session"}, status=400)
        called = sessions.pop(request.cookies[_COOKIE])
        return web.json_response({**body, "reward": _reward(body) if called else 0.0})

    async def call_tool(request: web.Request) -> web.Response:
        await request.json()
        if request.cookies.get(_COOKIE) not in sessions:
            return web.json_response({"detail": "no seeded session"}, status=400)
        sessions[request.cookies[_COOKIE]] += 1
        return web.json_response({"output": f"{request.match_info['tool']} done"})

    application = web.Application(client_max_size=64 * 1024 * 1024)
    application.router.add_post("/seed_session", seed)
    application.router.add_post("/verify", verify)
    application.router.add_post("/{tool}", call_tool)
    return application


def main() -> None:
    name = os.environ["NEMO_GYM_CONFIG_PATH"]
    entry = yaml.safe_load(os.environ["NEMO_GYM_CONFIG_DICT"])[name]
    server = next(iter(entry["resources_servers"].values()))
    web.run_app(app(), host=server["host"], port=int(server["port"]), access_log=None, print=None)


if __name__ == "__main__":
    main()
