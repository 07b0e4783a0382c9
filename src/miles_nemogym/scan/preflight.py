"""Before the first paid episode: is ``NEMO_GYM_URL`` a live ``mini_swe_agent_2`` server?

A scan of 500 instances against a wrong URL would otherwise record 500 transport
failures (each after the client's retries) instead of one clear error. The server is a
FastAPI app, so its ``/openapi.json`` answers in milliseconds and describes ``POST /run``.
An API-policy scan also needs ``/run`` to declare ``policy_base_url``: the body model keeps
unknown keys, so an older server would accept the field, ignore it and run every episode
on its own model — a scan that "passes" without ever calling the policy. The schema is
read with ``miles_nemogym.doctor.run_body_fields``, the same reading ``doctor`` uses.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp

from miles_nemogym.doctor import SchemaError, run_body_fields


class ServerCheckError(RuntimeError):
    """The server did not answer, or cannot run this scan; the message says why and the fix."""


async def check_server(gym_url: str, timeout_s: float, *, needs_policy_field: bool = False) -> None:
    """Raise ``ServerCheckError`` unless ``<gym_url>/openapi.json`` describes a usable ``POST /run``."""
    url = f"{gym_url}/openapi.json"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(url) as response,
        ):
            status = response.status
            raw = await response.read()
    except asyncio.TimeoutError:
        raise ServerCheckError(
            f"{url} did not answer within {timeout_s:g}s; is the NeMo-Gym server up and is "
            "NEMO_GYM_URL (or --gym-url) its address?"
        ) from None
    except aiohttp.ClientError as error:
        raise ServerCheckError(
            f"cannot reach {url} ({error}); start the NeMo-Gym server or fix NEMO_GYM_URL (or --gym-url)"
        ) from None
    if status != 200:
        raise ServerCheckError(
            f"{url} answered HTTP {status}; NEMO_GYM_URL must be the mini_swe_agent_2 agent server's "
            "base URL (its /openapi.json lists POST /run)"
        )
    try:
        name, fields = run_body_fields(json.loads(raw))
    except (ValueError, SchemaError) as error:
        raise ServerCheckError(
            f"{gym_url} answers but does not offer POST /run ({error}); NEMO_GYM_URL must be the "
            "mini_swe_agent_2 agent server, not the head server or a model server"
        ) from None
    if needs_policy_field and "policy_base_url" not in fields:
        raise ServerCheckError(
            f"{gym_url}: POST /run's body ({name}) declares no policy_base_url, so this server would "
            "ignore --policy-base-url and run every episode on its own configured model; upgrade it "
            "to the pinned nemo-gym (miles_nemogym.pins.NEMO_GYM_VERSION) or scan without "
            "--policy-base-url"
        )
