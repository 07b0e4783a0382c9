"""Build the ``/run`` body from what Miles hands the agent function. Pure functions.

Every sampling key the trainer sets goes somewhere: ``temperature``, ``top_p`` and
``max_output_tokens`` typed, the rest in ``metadata.extra_body`` (docs/episode-pipeline.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pydantic_core
from pydantic import ValidationError

from miles_nemogym.episode.protocol import ResponsesCreateParams, RunRequest
from miles_nemogym.episode.record import EVAL_REPORT_KEY, RECORD_KEY, REWARD_KEY
from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.rollout.roles import KEYS as ROLE_KEYS
from miles_nemogym.validation import describe

# Keys Miles adds to sample.metadata for its own bookkeeping (agentic_tool_call.py).
MILES_BOOKKEEPING_KEYS = frozenset({"max_seq_len", "session_server_id", "session_server_instance_id"})

# Keys this plugin returns and Miles merges back into sample.metadata. A sample that is
# retried or re-rolled carries them; they must never be sent as task fields.
PLUGIN_RESULT_KEYS = frozenset({REWARD_KEY, EVAL_REPORT_KEY, RECORD_KEY, "agent_metrics"})

# Routing and secrets come from the plugin, never from a data row.
ROUTING_KEYS = frozenset({"policy_base_url", "policy_api_key"})

# The train/eval marks of Miles' eval config are ours (rollout/roles.py), not the task's.
NOT_SENT_KEYS = MILES_BOOKKEEPING_KEYS | PLUGIN_RESULT_KEYS | ROUTING_KEYS | ROLE_KEYS

# Trainer keys with a typed home in responses_create_params.
_TYPED_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "max_tokens": "max_output_tokens"}


class RequestBuildError(MilesNemoGymError, ValueError):
    """The task row or sampling parameters cannot form a body the server accepts."""


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestBuildError(f"{where} must be a JSON object encoded as a string: {error}") from None
    if not isinstance(value, dict):
        raise RequestBuildError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


_JSON_SCALARS = (str, int, type(None))  # bool is an int


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


def _json_problem_or_cycle(value: Any) -> str | None:
    try:
        return _json_problem(value)
    except RecursionError:
        return "a circular or too deeply nested value"


def _check_json_value(key: str, value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestBuildError(f"request_kwargs[{key!r}] must be finite, got {value!r}")
    if _json_problem_or_cycle(value):
        raise RequestBuildError(
            f"request_kwargs[{key!r}] = {value!r} cannot be sent as JSON; pass numbers, strings, "
            "booleans or lists of them"
        )


def split_sampling(request_kwargs: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
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
    typed, extra = split_sampling(request_kwargs)
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


def _row_extra_body(raw: Any) -> dict[str, Any]:
    where = "metadata['responses_create_params']['metadata']['extra_body']"
    if raw is None:
        return {}
    if isinstance(raw, str):
        return _json_object(raw, where)
    if isinstance(raw, Mapping):
        return dict(raw)
    raise RequestBuildError(f"{where} must be a JSON object encoded as a string")


_UNKNOWN_KEY = "the NeMo-Gym server rejects this key; remove it from the task row"


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
    body = {key: value for key, value in metadata.items() if key not in NOT_SENT_KEYS}
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


def encode_body(body: Mapping[str, Any]) -> bytes:
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
