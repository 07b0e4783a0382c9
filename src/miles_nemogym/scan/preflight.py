"""Before the first paid episode: is ``NEMO_GYM_URL`` a live ``mini_swe_agent_2`` server?

A scan of 500 instances against a wrong URL would otherwise record 500 transport
failures (each after the client's retries) instead of one clear error. The server is a
FastAPI app, so its ``/openapi.json`` answers in milliseconds and lists ``POST /run``.
``miles-nemogym doctor`` checks more (the ``policy_base_url`` field, routability); this
check is only what a scan cannot start without.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp


class ServerUnreachable(RuntimeError):
    """The server did not answer, or is not a NeMo-Gym agent server; the message says which."""


async def check_server(gym_url: str, timeout_s: float) -> None:
    """Raise ``ServerUnreachable`` unless ``GET <gym_url>/openapi.json`` lists ``POST /run``."""
    url = f"{gym_url}/openapi.json"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(url) as response,
        ):
            status = response.status
            raw = await response.read()
    except asyncio.TimeoutError:
        raise ServerUnreachable(
            f"{url} did not answer within {timeout_s:g}s; is the NeMo-Gym server up and is "
            "NEMO_GYM_URL (or --gym-url) its address?"
        ) from None
    except aiohttp.ClientError as error:
        raise ServerUnreachable(
            f"cannot reach {url} ({error}); start the NeMo-Gym server or fix NEMO_GYM_URL (or --gym-url)"
        ) from None
    if status != 200:
        raise ServerUnreachable(
            f"{url} answered HTTP {status}; NEMO_GYM_URL must be the mini_swe_agent_2 agent server's "
            "base URL (its /openapi.json lists POST /run)"
        )
    try:
        paths = json.loads(raw).get("paths") or {}
    except (ValueError, AttributeError):
        paths = {}
    if not isinstance(paths, dict) or "post" not in (paths.get("/run") or {}):
        raise ServerUnreachable(
            f"{gym_url} answers but does not offer POST /run; NEMO_GYM_URL must be the "
            "mini_swe_agent_2 agent server, not the head server or a model server"
        )
