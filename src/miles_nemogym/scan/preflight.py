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

from miles_nemogym.doctor import FetchError, SchemaError, fetch_json_async, run_body_fields
from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.redaction import redact_url


class ServerCheckError(MilesNemoGymError, RuntimeError):
    """The server did not answer, or cannot run this scan; the message says why and the fix."""


async def check_server(gym_url: str, timeout_s: float, *, needs_policy_field: bool = False) -> None:
    """Raise ``ServerCheckError`` unless ``<gym_url>/openapi.json`` describes a usable ``POST /run``.

    Fetched as ``doctor`` fetches it: one deadline for the whole answer, no redirects, a size cap.
    """
    url = f"{gym_url}/openapi.json"
    shown, base = redact_url(url), redact_url(gym_url)
    try:
        document = await fetch_json_async(url, timeout_s)
    except FetchError as error:
        if error.kind == "timeout":
            raise ServerCheckError(
                f"{shown} did not answer within {timeout_s:g}s; is the NeMo-Gym server up and is "
                "NEMO_GYM_URL (or --gym-url) its address?"
            ) from None
        if error.kind in ("http", "redirect"):
            raise ServerCheckError(
                f"{shown} answered {error}; NEMO_GYM_URL must be the mini_swe_agent_2 agent server's "
                "own base URL (its /openapi.json lists POST /run)"
            ) from None
        if error.kind in ("not-json", "too-large"):
            raise ServerCheckError(
                f"{base} answers but does not offer POST /run ({error}); NEMO_GYM_URL must be the "
                "mini_swe_agent_2 agent server, not the head server or a model server"
            ) from None
        raise ServerCheckError(
            f"cannot reach {shown} ({error}); start the NeMo-Gym server or fix NEMO_GYM_URL (or --gym-url)"
        ) from None
    try:
        name, fields = run_body_fields(document)
    except SchemaError as error:
        raise ServerCheckError(
            f"{base} answers but does not offer POST /run ({error}); NEMO_GYM_URL must be the "
            "mini_swe_agent_2 agent server, not the head server or a model server"
        ) from None
    if needs_policy_field and "policy_base_url" not in fields:
        raise ServerCheckError(
            f"{base}: POST /run's body ({name}) declares no policy_base_url, so this server would "
            "ignore --policy-base-url and run every episode on its own configured model; upgrade it "
            "to the pinned nemo-gym (miles_nemogym.pins.NEMO_GYM_VERSION) or scan without "
            "--policy-base-url"
        )
