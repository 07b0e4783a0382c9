"""The ``/run`` body of one episode, built once from what Miles hands the agent function.

The task row, the trainer's sampling (every key goes somewhere: ``temperature``, ``top_p``
and ``max_output_tokens`` typed, the rest in ``metadata.extra_body``) and the policy URL the
Gym host dials (Miles' session URL + ``/v1``, a wildcard host made dialable), validated as
the server validates it and encoded once (docs/episode-pipeline.md).
"""

from __future__ import annotations

import json
import logging
import math
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

import pydantic_core
from pydantic import ValidationError

from miles_nemogym.episode.protocol import ResponsesCreateParams, RunRequest
from miles_nemogym.episode.record import (
    AGENT_METRICS_KEY,
    EVAL_REPORT_KEY,
    RECORD_KEY,
    REWARD_KEY,
    ROW_MARKS,
    task_id_of,
)
from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.hosts import bracket, is_loopback, is_wildcard
from miles_nemogym.log_once import log_once
from miles_nemogym.redaction import redact_url
from miles_nemogym.settings import Settings
from miles_nemogym.validation import describe

__all__ = [
    "ROUTING_KEYS",
    "PolicyUrlError",
    "RequestBuildError",
    "RunBody",
    "build_body",
    "build_run_body",
    "check_session_url",
    "policy_base_url",
    "responses_create_params",
    "routable_local_address",
    "task_row",
]

logger = logging.getLogger(__name__)

# Keys Miles adds to sample.metadata for its own bookkeeping (agentic_tool_call.py).
_MILES_BOOKKEEPING_KEYS = frozenset({"max_seq_len", "session_server_id", "session_server_instance_id"})

# Keys this plugin returns and Miles merges back into sample.metadata. A sample that is
# retried or re-rolled carries them; they must never be sent as task fields.
_PLUGIN_RESULT_KEYS = frozenset({REWARD_KEY, EVAL_REPORT_KEY, RECORD_KEY, AGENT_METRICS_KEY})

# Routing and secrets come from the plugin, never from a data row.
ROUTING_KEYS = frozenset({"policy_base_url", "policy_api_key"})

# The train/eval, environment and task-id marks are ours (episode/record.py), not the task's.
_NOT_SENT_KEYS = _MILES_BOOKKEEPING_KEYS | _PLUGIN_RESULT_KEYS | ROUTING_KEYS | ROW_MARKS

# Trainer keys with a typed home in responses_create_params.
_TYPED_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "max_tokens": "max_output_tokens"}

_JSON_SCALARS = (str, int, type(None))  # bool is an int

_UNKNOWN_KEY = "the NeMo-Gym server rejects this key; remove it from the task row"


class RequestBuildError(MilesNemoGymError, ValueError):
    """The task row or sampling parameters cannot form a body the server accepts."""


class PolicyUrlError(MilesNemoGymError, ValueError):
    """The session URL Miles passed cannot become a policy URL."""


@dataclass(frozen=True)
class RunBody:
    """One episode's ``/run`` body, encoded once; the same bytes go out on every send."""

    payload: bytes
    instance_id: str | None


def policy_base_url(session_url: str, gym_url: str, external_host: str | None = None) -> str:
    """``session_url`` + ``/v1`` with its host made dialable from the Gym server.

    ``external_host`` (``MILES_ROUTER_EXTERNAL_HOST``) replaces the host whatever it is,
    as upstream does; otherwise only a wildcard host is replaced.
    """
    parts = check_session_url(session_url)
    try:
        netloc = _dialable_netloc(parts.netloc, gym_url, external_host)
    except ValueError as error:  # urlsplit's own: a bad port
        raise PolicyUrlError(f"base_url {redact_url(session_url)!r} is malformed ({error}); {_EXPECTED}") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return urlunsplit((parts.scheme, netloc, path, "", ""))


_EXPECTED = "Miles passes http://<session_server_ip>:<port>/sessions/<session_id>"


def check_session_url(session_url: Any) -> SplitResult:
    """The parts of the session URL Miles passed as ``base_url``; ``PolicyUrlError`` when it is
    not an http(s) URL (both paths call the policy through it)."""
    if not isinstance(session_url, str):
        raise PolicyUrlError(f"base_url must be a string, got {type(session_url).__name__}; {_EXPECTED}")
    try:
        parts = urlsplit(session_url.strip())
    except ValueError as error:  # urlsplit's own: an unclosed IPv6 bracket
        raise PolicyUrlError(f"base_url {redact_url(session_url)!r} is malformed ({error}); {_EXPECTED}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PolicyUrlError(f"base_url {redact_url(session_url)!r} is not an http(s) URL; {_EXPECTED}")
    return parts


@lru_cache(maxsize=256)
def _dialable_netloc(netloc: str, gym_url: str, external_host: str | None) -> str:
    """The session URL's netloc made dialable; one parse per session server, not per sample."""
    parts = urlsplit(f"//{netloc}")
    host = parts.hostname or ""
    if external_host:
        host = external_host
    elif is_wildcard(host):
        gym = urlsplit(gym_url)
        host = routable_local_address(gym.hostname or "localhost", gym.port or 80)
    return bracket(host) + (f":{parts.port}" if parts.port else "")


@lru_cache(maxsize=64)
def routable_local_address(target_host: str, target_port: int = 80) -> str:
    """The local address that routes to ``target_host``; logged once per target."""
    if is_loopback(target_host):
        address = "127.0.0.1"
    else:
        try:
            infos = socket.getaddrinfo(target_host, target_port, type=socket.SOCK_DGRAM)
            family, _, _, _, sockaddr = infos[0]
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(sockaddr)
                address = str(probe.getsockname()[0])
        except OSError as error:
            raise PolicyUrlError(
                f"the session server listens on a wildcard address and the local address that "
                f"routes to the NeMo-Gym host {target_host!r} could not be found ({error}); set "
                f"MILES_ROUTER_EXTERNAL_HOST to an address of this node that the Gym host can dial"
            ) from None
    log_once(
        logger,
        logging.INFO,
        f"policy address {target_host} {address}",
        "session server listens on a wildcard address; the NeMo-Gym server at %s will dial "
        "policy URLs on %s (set MILES_ROUTER_EXTERNAL_HOST to override)",
        target_host,
        address,
    )
    return address


def build_body(
    metadata: Mapping[str, Any] | None,
    request_kwargs: Mapping[str, Any] | None,
    settings: Settings,
    *,
    policy_base_url: str | None,
    send_api_key: bool = True,
) -> RunBody:
    """The encoded ``/run`` body for one task row; raises ``RequestBuildError`` naming the bad
    field. ``policy_base_url`` None lets the server use its own model; ``send_api_key`` False
    keeps the key (``NEMO_GYM_POLICY_API_KEY``) from going with the request."""
    key = settings.policy_api_key.get_secret_value() if settings.policy_api_key and send_api_key else None
    body = build_run_body(metadata, request_kwargs, policy_base_url=policy_base_url, policy_api_key=key)
    return RunBody(_encode(body), task_id_of(body))


def build_run_body(
    metadata: Mapping[str, Any] | None,
    request_kwargs: Mapping[str, Any] | None,
    *,
    policy_base_url: str | None,
    policy_api_key: str | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /run`` for one episode. ``metadata`` is not mutated.

    ``policy_base_url`` None leaves routing to the server's configured model (scan mode).
    """
    if metadata is not None and not isinstance(metadata, Mapping):
        raise RequestBuildError(
            f"sample metadata must be a dict holding the task instance (instance_id, repo, ...), "
            f"got {type(metadata).__name__}; convert the data with `miles-nemogym convert`"
        )
    if not metadata:
        raise RequestBuildError(
            "sample metadata is empty: the task instance (instance_id, repo, base_commit, ...) "
            "must be in each prompt row's 'metadata'; convert the data with `miles-nemogym convert`"
        )
    body = task_row(metadata)
    body["responses_create_params"] = responses_create_params(metadata.get("responses_create_params"), request_kwargs)
    if policy_base_url is not None:
        body["policy_base_url"] = policy_base_url
    if policy_api_key:
        body["policy_api_key"] = policy_api_key
    try:
        RunRequest.model_validate(body)
    except ValidationError as error:
        raise RequestBuildError(describe(error, "metadata", unknown_key=_UNKNOWN_KEY)) from None
    for key, value in body.items():
        problem = _json_problem_or_cycle(value)
        if problem:
            raise RequestBuildError(
                f"the task row in metadata cannot be sent as JSON: metadata[{key!r}] holds {problem}"
            )
    return body


def task_row(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The task row in a sample's metadata as a server gets it: without our marks, Miles'
    bookkeeping keys, the keys this plugin returned, and routing or secrets."""
    return {key: value for key, value in metadata.items() if key not in _NOT_SENT_KEYS}


def responses_create_params(
    row_params: Mapping[str, Any] | None, request_kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Merge a row's own ``responses_create_params`` with the trainer's sampling: the trainer
    wins on every key it sets (also inside ``extra_body``); keys only the row sets are kept."""
    if row_params is not None and not isinstance(row_params, Mapping):
        raise RequestBuildError(
            "metadata['responses_create_params'] must be an object (NeMo-Gym's row format), "
            f"got {type(row_params).__name__}"
        )
    params: dict[str, Any] = dict(row_params or {})
    params.setdefault("input", [])
    typed, extra = _split_sampling(request_kwargs)
    params.update(typed)

    row_metadata = params.get("metadata") or {}
    if not isinstance(row_metadata, Mapping):
        raise RequestBuildError("metadata['responses_create_params']['metadata'] must be a dict[str, str]")
    metadata = dict(row_metadata)
    # The row's extra_body is checked whether or not the trainer adds keys to it: a row
    # must not be sent or refused depending on the trainer's flags. A row may carry it as
    # an object; the server only takes it as a JSON string.
    row_extra = _row_extra_body(metadata.get("extra_body"))
    if extra or isinstance(metadata.get("extra_body"), Mapping):
        merged = row_extra
        merged.update(extra)
        try:
            metadata["extra_body"] = json.dumps(merged, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise RequestBuildError(
                f"responses_create_params.metadata.extra_body cannot be sent as JSON: {error}"
            ) from None
    if metadata:
        params["metadata"] = metadata

    try:
        model = ResponsesCreateParams.model_validate(params)
    except ValidationError as error:
        raise RequestBuildError(describe(error, "responses_create_params", unknown_key=_UNKNOWN_KEY)) from None
    return model.model_dump(exclude_none=True)


def _split_sampling(request_kwargs: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split Miles' sampling parameters into typed fields and ``extra_body`` keys.

    ``None`` values mean "not set" in Miles and are dropped; every other key is kept.
    """
    if request_kwargs is not None and not isinstance(request_kwargs, Mapping):
        raise RequestBuildError(
            f"request_kwargs must be a dict of sampling parameters (Miles' sampling_params), "
            f"got {type(request_kwargs).__name__}"
        )
    typed: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in (request_kwargs or {}).items():
        if value is None:
            continue
        _check_json_value(key, value)
        if key in _TYPED_SAMPLING:
            typed[_TYPED_SAMPLING[key]] = value
        else:
            extra[key] = value
    return typed, extra


def _row_extra_body(raw: Any) -> dict[str, Any]:
    where = "metadata['responses_create_params']['metadata']['extra_body']"
    if raw is None:
        return {}
    if isinstance(raw, str):
        return _json_object(raw, where)
    if isinstance(raw, Mapping):
        return dict(raw)
    raise RequestBuildError(f"{where} must be a JSON object encoded as a string")


def _check_json_value(key: str, value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestBuildError(f"request_kwargs[{key!r}] must be finite, got {value!r}")
    if _json_problem_or_cycle(value):
        raise RequestBuildError(
            f"request_kwargs[{key!r}] = {value!r} cannot be sent as JSON; pass numbers, strings, "
            "booleans or lists of them"
        )


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestBuildError(f"{where} must be a JSON object encoded as a string: {error}") from None
    if not isinstance(value, dict):
        raise RequestBuildError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _json_problem_or_cycle(value: Any) -> str | None:
    try:
        return _json_problem(value)
    except RecursionError:
        return "a circular or too deeply nested value"


def _json_problem(value: Any) -> str | None:
    """What stops ``json.dumps(value, allow_nan=False)`` from succeeding, or None; a walk,
    cheaper than serializing on the per-sample path. Raises ``RecursionError`` on a cycle."""
    if isinstance(value, _JSON_SCALARS):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"a non-finite number ({value!r})"
    if isinstance(value, (list, tuple)):
        for item in value:
            if not isinstance(item, str):
                problem = _json_problem(item)
                if problem:
                    return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, _JSON_SCALARS):
                if not isinstance(key, float):
                    return f"a key of type {type(key).__name__}"
                if not math.isfinite(key):
                    return f"a non-finite key ({key!r})"
            if not isinstance(item, str):
                problem = _json_problem(item)
                if problem:
                    return problem
        return None
    return f"a value of type {type(value).__name__}"


def _encode(body: Mapping[str, Any]) -> bytes:
    """The ``/run`` body as JSON bytes (pydantic-core's encoder); ``RequestBuildError`` names
    a field that cannot be (text that is not valid Unicode: ``build_run_body`` checked the rest)."""
    try:
        return pydantic_core.to_json(body)
    except pydantic_core.PydanticSerializationError:
        where = _unencodable(body, "metadata") or "metadata"
        raise RequestBuildError(
            f"{where} holds text that is not valid Unicode (a lone surrogate such as '\\udc80'); "
            "fix the task row's encoding"
        ) from None


def _unencodable(value: Any, where: str) -> str | None:
    """The path of the first string in ``value`` that UTF-8 cannot encode."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _unencodable(key, f"{where} (a key)") or _unencodable(item, f"{where}[{key!r}]")
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _unencodable(item, f"{where}[{index}]")
            if found:
                return found
    return None
