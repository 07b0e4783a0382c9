"""Episodes played by an agent server's own ``POST /run``: SWE (``mini_swe_agent_2``) and an agent
row (routed by ``_ng_rollout_id``); prepare the body once, POST it, score the answer. Why each rule:
docs/episode-pipeline.md."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import socket
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError
from typing_extensions import TypedDict

from miles_nemogym.episode.record import (
    Outcome,
    Task,
    TestCounts,
    failure,
    failure_of,
    finite_json,
    instance_report,
    judge,
    range_setting,
    row_extra_body,
    same_instance,
    short_reason,
    shown,
    task_row,
)
from miles_nemogym.errors import (
    AGENT_REQUEST_FAILED,
    AGENT_RUN_ERROR,
    AGENT_TIMEOUT,
    Failed,
    RequestError,
    SettingsError,
    UrlError,
    describe,
    redact_url,
)
from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import (
    SECRET_VARIABLE,
    rollout_id,
    secret_problem,
)
from miles_nemogym.settings import EnvironmentServer, Settings, TimeoutReward
from miles_nemogym.transport import Deadline, bracket, check_session_url, is_loopback, is_wildcard, pool, request

__all__ = ["policy_base_url"]

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- the /run wire models
# nemo-gym 0.7.0's mini_swe_agent_2: the request strict where the server is (422 for an unknown
# responses_create_params key); the answer parsed only as far as the judge reads it.


class ResponsesCreateParams(BaseModel):
    """nemo-gym's ``NeMoGymResponseCreateParamsNonStreaming``: what mini_swe_agent_2 uses typed, the rest untyped."""

    model_config = ConfigDict(extra="forbid")

    input: str | list[Any] = Field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    parallel_tool_calls: bool | None = None
    tool_choice: str | dict[str, Any] | None = None
    metadata: dict[str, StrictStr] | None = None
    """``extra_body`` (a JSON object as a string) is merged into every chat request the harness sends."""

    # Accepted by the server's schema, unused by mini_swe_agent_2.
    background: bool | None = None
    include: list[Any] | None = None
    instructions: str | None = None
    max_tool_calls: int | None = None
    model: str | None = None
    previous_response_id: str | None = None
    prompt: Any = None
    reasoning: Any = None
    service_tier: str | None = None
    store: bool | None = None
    context_management: list[Any] | None = None
    conversation: Any = None
    moderation: Any = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    stream_options: Any = None
    text: Any = None
    tools: list[Any] | None = None
    truncation: str | None = None
    user: str | None = None
    stream: bool | None = None


class RunRequest(BaseModel):
    """The ``/run`` body: the task instance at the top level plus the routing fields."""

    model_config = ConfigDict(extra="allow")

    instance_id: StrictStr = Field(min_length=1)
    responses_create_params: ResponsesCreateParams
    policy_base_url: str | None = None
    policy_api_key: str | None = Field(default=None, repr=False)
    subset: str | None = None
    split: str | None = None


class OutputItem(TypedDict, total=False):
    """A trajectory item (type and role are read); a TypedDict: a million items validate much faster as dicts."""

    type: str | None
    role: str | None


class _ResponseObject(BaseModel):
    model_config = ConfigDict(extra="ignore")

    output: list[OutputItem] = Field(default_factory=list)


class RunResponse(BaseModel):
    """A ``/run`` result; unread parts (most of the bytes) are not built into objects: no garbage-collector tax."""

    model_config = ConfigDict(extra="ignore")

    reward: Any = None  # checked by the judge: pydantic would coerce a string or a boolean to a float
    instance_id: str | None = None
    metadata: dict[str, Any] | None = None  # graded: {instance_id, model_patch, eval_report}; crashed: {error, ...}
    response: _ResponseObject | None = None
    mask_sample: Any = False  # checked by the judge, as failure_kind is
    failure_kind: Any = None
    failure_reason: Any = None


# Trainer keys with a typed home in responses_create_params.
_TYPED_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "max_tokens": "max_output_tokens"}

_JSON_SCALARS = (str, int, type(None))  # bool is an int

_UNKNOWN_KEY = "the NeMo-Gym server rejects this key; remove it from the task row"

# Answers above this are scored in a worker thread (a runaway 100 MB one would stall the loop for seconds).
_OFF_LOOP_BYTES = 4 * 1024 * 1024

_DEFAULT_REWARD_RANGE = (0.0, 1.0)
_ERROR_DETAIL_CHARS = 300

ROLLOUT_ID_KEY = "_ng_rollout_id"  # the /run body's rollout id (nemo-gym's alias field, kept from /verify)
_ECHOED = frozenset({"response", "responses_create_params", "reward"})  # not kept as an agent's report

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class RunEpisode:
    """One ``/run`` body (a SWE row's, or an agent row's for its agent server), encoded once: the same
    bytes go out on every try."""

    payload: bytes
    task_id: str | None
    settings: Settings
    server_url: str
    setting: str  # the variable naming the server
    score: Callable[..., Outcome]  # the answer's scorer: (status, body, scrub=...)
    lowest: float  # the episode's lowest reward
    session_url: str | None = None  # Miles' session, asked on a timeout whether the policy was called; None: a scan

    async def attempt(self, deadline: Deadline) -> Outcome:
        """POST the body and score the answer (in a worker thread when large); a timeout is the policy's
        when its session recorded a model call and the server had not begun its answer."""
        settings = self.settings
        connections = await pool(settings.max_concurrency)
        try:
            answer = await request(
                connections.gym,
                "POST",
                f"{self.server_url}/run",
                payload=self.payload,
                deadline=deadline,
                connect_timeout_s=settings.connect_timeout_s,
                cap=settings.max_result_bytes,
            )
        except Failed as error:
            if error.kind != AGENT_TIMEOUT:
                raise
            if not error.answered and settings.timeout_reward is not TimeoutReward.mask and self.session_url:
                error.policy = await _policy_was_called(settings, self.session_url)
            return failure_of(error, None, settings, lowest=self.lowest)
        if answer.over_cap:
            return failure(
                AGENT_RUN_ERROR,
                f"the /run answer exceeds NEMO_GYM_MAX_RESULT_BYTES={settings.max_result_bytes} "
                f"(at least {answer.size} bytes decoded); not read further",
                http_status=answer.status,
            )
        scrubber = settings.key_scrubber()
        scored = partial(self.score, answer.status, answer.body, scrub=None if scrubber is None else scrubber.scrub)
        if len(answer.body) > _OFF_LOOP_BYTES:
            outcome = await asyncio.get_running_loop().run_in_executor(None, scored)
        else:
            outcome = scored()
        outcome.answer = answer.body  # kept for the episode store (scrubbed there)
        return outcome


async def _policy_was_called(settings: Settings, session_url: str) -> bool:
    """Whether Miles' session (``GET /sessions/<id>``) recorded a model call the policy answered."""
    connections = await pool(settings.max_concurrency)
    try:
        answer = await request(
            connections.policy,
            "GET",
            session_url.strip().rstrip("/"),
            deadline=Deadline(settings.connect_timeout_s),
            connect_timeout_s=settings.connect_timeout_s,
            cap=settings.max_result_bytes,
        )
    except Failed:
        return False
    if answer.status != 200:
        return False
    if answer.over_cap:  # records past the cap: many calls were made
        return True
    try:
        records = pydantic_core.from_json(answer.body).get("records")
    except (ValueError, AttributeError):
        return False
    return isinstance(records, list) and any(
        isinstance(one, dict) and isinstance(one.get("status_code"), int) and one["status_code"] < 400
        for one in records
    )


def prepare(
    task: Task,
    request_kwargs: Mapping[str, Any] | None,
    settings: Settings,
    *,
    policy_url: str | None,
    send_api_key: bool,
    session_url: str | None = None,
) -> RunEpisode:
    """The episode of one SWE row naming ``policy_url`` as its model (None: the server's own, a golden scan)."""
    key = settings.policy_api_key.get_secret_value() if settings.policy_api_key and send_api_key else None
    body = build_run_body(task.metadata, request_kwargs, policy_base_url=policy_url, policy_api_key=key)
    score = partial(classify_http, instance_id=task.task_id, reward_range=settings.reward_range)
    lowest = settings.reward_range[0]
    return RunEpisode(
        _encode(body), task.task_id, settings, settings.gym_url, "NEMO_GYM_URL", score, lowest, session_url
    )


def prepare_agent(
    task: Task,
    request_kwargs: Mapping[str, Any] | None,
    server: EnvironmentServer,
    settings: Settings,
    *,
    session_url: str,
    addresses: MutableMapping[tuple[str, int], str] | None = None,
) -> RunEpisode:
    """The episode of an agent row for Miles' session ``session_url``: the task row, and as
    ``_ng_rollout_id`` the policy URL the agent's host dials, signed (``routing_contract.py``)."""
    environment = task.environment
    secret = settings.rollout_secret.get_secret_value() if settings.rollout_secret else ""
    problem = secret_problem(secret)
    if problem:
        raise SettingsError(
            f"{problem}: environment {environment!r} is played by an agent server whose routing model forwards "
            f"only calls the trainer signed; export the {SECRET_VARIABLE} line `miles-nemogym serve` printed"
        )
    policy = policy_base_url(session_url, str(server.agent), settings.external_host, addresses)
    body = _row_body(task.metadata, request_kwargs)
    body[ROLLOUT_ID_KEY] = rollout_id(policy, secret)
    _check_sendable(body)
    valid = server.valid_rewards(settings.reward_range)
    score = partial(classify_agent_http, reward_range=valid, range_name=range_setting(environment, server))
    return RunEpisode(
        _encode(body), task.task_id, settings, str(server.agent), "NEMO_GYM_ENVS", score, valid[0], session_url
    )


def policy_base_url(
    session_url: str,
    gym_url: str,
    external_host: str | None = None,
    addresses: MutableMapping[tuple[str, int], str] | None = None,
) -> str:
    """``session_url`` + ``/v1`` with its host dialable from the Gym server: ``external_host``
    (``MILES_ROUTER_EXTERNAL_HOST``) if set, as upstream does; else only a wildcard host is replaced,
    by the local address routed to the Gym host (found once per Gym host, kept in ``addresses``)."""
    parts = check_session_url(session_url)
    try:  # urlsplit's own ValueError: a bad port
        host, port = external_host or parts.hostname or "", parts.port
        if not external_host and is_wildcard(host):
            gym = urlsplit(gym_url)
            target = (gym.hostname or "localhost", gym.port or 80)
            addresses = {} if addresses is None else addresses
            if target not in addresses:
                addresses[target] = routable_local_address(*target)
            host = addresses[target]
    except ValueError as error:
        raise UrlError(f"base_url {redact_url(session_url)!r} is malformed ({error})") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return urlunsplit((parts.scheme, bracket(host) + (f":{port}" if port else ""), path, "", ""))


def routable_local_address(target_host: str, target_port: int = 80) -> str:
    """The local address that routes to ``target_host``, logged (callers keep it: ``addresses``)."""
    if is_loopback(target_host):
        address = "127.0.0.1"
    else:
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(target_host, target_port, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(sockaddr)
                address = str(probe.getsockname()[0])
        except OSError as error:
            raise RequestError(
                f"the session server listens on a wildcard address and the local address that "
                f"routes to the NeMo-Gym host {target_host!r} could not be found ({error}); set "
                f"MILES_ROUTER_EXTERNAL_HOST to an address of this node that the Gym host can dial"
            ) from None
    logger.info(
        "session server listens on a wildcard address; the NeMo-Gym server at %s will dial "
        "policy URLs on %s (set MILES_ROUTER_EXTERNAL_HOST to override)",
        target_host,
        address,
    )
    return address


def build_run_body(
    metadata: Mapping[str, Any] | None,
    request_kwargs: Mapping[str, Any] | None,
    *,
    policy_base_url: str | None,
    policy_api_key: str | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /run``; ``policy_base_url`` None: the server's own model (scan mode)."""
    body = _row_body(metadata, request_kwargs)
    if policy_base_url is not None:
        body["policy_base_url"] = policy_base_url
    if policy_api_key:
        body["policy_api_key"] = policy_api_key
    try:
        RunRequest.model_validate(body)
    except ValidationError as error:
        raise RequestError(describe(error, "metadata", unknown_key=_UNKNOWN_KEY)) from None
    _check_sendable(body)
    return body


def _row_body(metadata: object, request_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    body = task_row(metadata)
    body["responses_create_params"] = responses_create_params(body.get("responses_create_params"), request_kwargs)
    return body


def _check_sendable(body: Mapping[str, Any]) -> None:
    for key, value in body.items():
        problem = _json_problem_or_cycle(value)
        if problem:
            raise RequestError(f"the task row in metadata cannot be sent as JSON: metadata[{key!r}] holds {problem}")


def responses_create_params(
    row_params: Mapping[str, Any] | None, request_kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A row's ``responses_create_params`` with the trainer's sampling over it (also inside ``extra_body``)."""
    if row_params is not None and not isinstance(row_params, Mapping):
        raise RequestError(
            "metadata['responses_create_params'] must be an object (NeMo-Gym's row format), "
            f"got {type(row_params).__name__}"
        )
    params: dict[str, Any] = dict(row_params or {})
    params.setdefault("input", [])
    if request_kwargs is not None and not isinstance(request_kwargs, Mapping):
        raise RequestError(
            f"request_kwargs must be a dict of sampling parameters (Miles' sampling_params), "
            f"got {type(request_kwargs).__name__}"
        )
    extra: dict[str, Any] = {}  # the trainer's keys without a typed field: extra_body's
    for key, value in (request_kwargs or {}).items():
        if value is None:  # "not set" in Miles
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise RequestError(f"request_kwargs[{key!r}] must be finite, got {value!r}")
        if _json_problem_or_cycle(value):
            raise RequestError(
                f"request_kwargs[{key!r}] = {value!r} cannot be sent as JSON; pass numbers, strings, "
                "booleans or lists of them"
            )
        if key in _TYPED_SAMPLING:
            params[_TYPED_SAMPLING[key]] = value
        else:
            extra[key] = value

    row_metadata = params.get("metadata") or {}
    if not isinstance(row_metadata, Mapping):
        raise RequestError("metadata['responses_create_params']['metadata'] must be a dict[str, str]")
    metadata = dict(row_metadata)
    # Checked even when the trainer adds nothing; the server only takes it as a JSON string.
    row_extra = row_extra_body(
        metadata.get("extra_body"), "metadata['responses_create_params']['metadata']['extra_body']"
    )
    if extra or isinstance(metadata.get("extra_body"), Mapping):
        row_extra.update(extra)
        try:
            metadata["extra_body"] = json.dumps(row_extra, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise RequestError(f"responses_create_params.metadata.extra_body cannot be sent as JSON: {error}") from None
    if metadata:
        params["metadata"] = metadata

    try:
        model = ResponsesCreateParams.model_validate(params)
    except ValidationError as error:
        raise RequestError(describe(error, "responses_create_params", unknown_key=_UNKNOWN_KEY)) from None
    return model.model_dump(exclude_none=True)


def _json_problem_or_cycle(value: Any) -> str | None:
    try:
        return _json_problem(value)
    except RecursionError:
        return "a circular or too deeply nested value"


def _json_problem(value: Any) -> str | None:
    """What stops ``json.dumps(value, allow_nan=False)``, or None (a walk: cheaper than serializing)."""
    if isinstance(value, _JSON_SCALARS):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"a non-finite number ({value!r})"
    if isinstance(value, (list, tuple)):
        return next(filter(None, map(_json_problem, value)), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (*_JSON_SCALARS, float)):
                return f"a key of type {type(key).__name__}"
            if isinstance(key, float) and not math.isfinite(key):
                return f"a non-finite key ({key!r})"
            problem = _json_problem(item)
            if problem:
                return problem
        return None
    return f"a value of type {type(value).__name__}"


def _encode(body: Mapping[str, Any]) -> bytes:
    """The ``/run`` body as JSON bytes; ``RequestError`` names a string that is not valid Unicode."""
    try:
        return pydantic_core.to_json(body)
    except pydantic_core.PydanticSerializationError:
        where = _unencodable(body, "metadata") or "metadata"
        raise RequestError(
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
        found = (_unencodable(k, f"{where} (a key)") or _unencodable(v, f"{where}[{k!r}]") for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        found = (_unencodable(item, f"{where}[{index}]") for index, item in enumerate(value))
    else:
        return None
    return next(filter(None, found), None)


def classify_http(
    status: int,
    body: bytes,
    *,
    instance_id: str | None = None,
    reward_range: tuple[float, float] = _DEFAULT_REWARD_RANGE,
    scrub: Callable[[bytes], bytes] | None = None,
) -> Outcome:
    """Any HTTP answer from ``/run`` as an ``Outcome`` (status, then body), ``scrub`` applied before any read."""
    if scrub is not None and status != 200:
        body = scrub(body)
    if status >= 400:
        kind = AGENT_RUN_ERROR if status >= 500 else AGENT_REQUEST_FAILED
        return failure(kind, f"HTTP {status}: {_error_detail(body)}", http_status=status)
    if status != 200:
        return failure(AGENT_RUN_ERROR, f"unexpected HTTP {status} from /run", http_status=status)
    try:
        response = RunResponse.model_validate_json(body)
    except ValidationError as error:
        if scrub is not None and scrub(body) != body:  # what is quoted below might hold it
            return classify_http(status, scrub(body), instance_id=instance_id, reward_range=reward_range)
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        return failure(
            AGENT_RUN_ERROR,
            f"undecodable /run result ({where}: {first['msg']}); is NEMO_GYM_URL a mini_swe_agent_2 server?",
            http_status=status,
        )
    if scrub is not None:
        scrubbed = _scrub_kept(response, scrub)
        if scrubbed is None:  # scrub the whole answer instead, then read it again
            return classify_http(status, scrub(body), instance_id=instance_id, reward_range=reward_range)
        response = scrubbed
    outcome = classify_run_response(
        response, http_status=status, sent_instance_id=instance_id, reward_range=reward_range
    )
    outcome.answer_is_json = True
    return outcome


def classify_agent_http(
    status: int,
    body: bytes,
    *,
    reward_range: tuple[float, float],
    range_name: str,
    scrub: Callable[[bytes], bytes] | None = None,
) -> Outcome:
    """The ``Outcome`` of an agent's ``/run`` answer: a named failure if HTTP or decoding fails, else ``judge``'s."""
    if scrub is not None:
        body = scrub(body)
    if status != 200:
        outcome = classify_http(status, body)
        outcome.record.failure_reason = short_reason(f"the agent's {outcome.record.failure_reason}")
        return outcome
    try:
        parsed = pydantic_core.from_json(body, allow_inf_nan=True)
        response = RunResponse.model_validate(parsed)
    except (ValueError, ValidationError) as error:
        detail = error.errors()[0]["msg"] if isinstance(error, ValidationError) else str(error)
        return failure(AGENT_RUN_ERROR, f"undecodable agent /run result ({detail[:200]})", http_status=status)
    if not isinstance(parsed, dict):
        return failure(AGENT_RUN_ERROR, "the agent's /run result is not a JSON object", http_status=status)
    report = finite_json({key: value for key, value in parsed.items() if key not in _ECHOED})
    outcome = judge(
        parsed, reward_range=reward_range, range_name=range_name, report=report, who="the agent", http_status=status
    )
    outcome.record.turns, outcome.record.tool_calls = _count_turns(response)
    outcome.answer_is_json = True
    return outcome


def _scrub_kept(response: RunResponse, scrub: Callable[[bytes], bytes]) -> RunResponse | None:
    """``response`` with its kept or quoted parts scrubbed (re-encoded); None when they cannot be re-encoded."""
    kept = response.model_dump(include={"reward", "instance_id", "metadata", "failure_kind", "failure_reason"})
    try:
        encoded = pydantic_core.to_json(kept, inf_nan_mode="constants")
    except pydantic_core.PydanticSerializationError:
        return None
    clean = scrub(encoded)
    if clean == encoded:
        return response
    return response.model_copy(update=pydantic_core.from_json(clean, allow_inf_nan=True))


def _error_detail(body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body[:_ERROR_DETAIL_CHARS].decode("utf-8", "replace")
    detail = parsed.get("detail", parsed) if isinstance(parsed, dict) else parsed
    return json.dumps(detail)[: _ERROR_DETAIL_CHARS * 2]


def classify_run_response(
    response: RunResponse,
    *,
    http_status: int = 200,
    sent_instance_id: str | None = None,
    reward_range: tuple[float, float] = _DEFAULT_REWARD_RANGE,
) -> Outcome:
    """``judge``'s verdict of a parsed ``/run`` result, with SWE's own checks (docs/episode-pipeline.md)."""
    metadata = finite_json(response.metadata or {})
    raw_id = response.instance_id or metadata.get("instance_id")
    reported_id = None if raw_id is None else str(raw_id)
    instance_id = sent_instance_id if sent_instance_id is not None else reported_id
    broken, graded = None, None
    report = instance_report(metadata, instance_id)
    if "error" in metadata:
        broken = f"server error: {_error_summary(metadata['error'])}"
    elif sent_instance_id is not None and reported_id is not None and not same_instance(reported_id, sent_instance_id):
        broken = f"the result is for instance {shown(reported_id)}, not for {sent_instance_id!r} that was sent"
    elif report is None:
        broken = "the server's result has no SWE-bench eval report for this instance, so its reward cannot be trusted"
    else:
        tests = report.get("tests_status") or {}
        graded = {
            "resolved": bool(report.get("resolved", False)),
            "patch_applied": bool(report.get("patch_successfully_applied", False)),
            "fail_to_pass": _test_counts(tests.get("FAIL_TO_PASS")),
            "pass_to_pass": _test_counts(tests.get("PASS_TO_PASS")),
        }
    outcome = judge(
        response.model_dump(include={"reward", "mask_sample", "failure_kind", "failure_reason"}),
        reward_range=reward_range,
        report=metadata,
        http_status=http_status,
        instance_id=instance_id,
        broken=broken,
        graded=graded,
    )
    outcome.record.turns, outcome.record.tool_calls = _count_turns(response)
    return outcome


def _error_summary(error: object) -> str:
    """The last line of a crashed episode's ``metadata.error`` (Ray-wrapped: colour codes, a traceback first)."""
    lines = [line.strip() for line in _ANSI.sub("", str(error)).splitlines() if line.strip()]
    return lines[-1] if lines else "no error text"


def _count_turns(response: RunResponse) -> tuple[int, int]:
    """(model turns, tool calls): a turn ends at a ``function_call_output`` or a user message."""
    turns = 0
    tool_calls = 0
    in_turn = False
    for item in response.response.output if response.response else []:
        kind = item.get("type")
        if kind == "function_call_output" or item.get("role") == "user":
            in_turn = False
            continue
        if kind == "function_call":
            tool_calls += 1
        if not in_turn:
            turns += 1
            in_turn = True
    return turns, tool_calls


def _test_counts(status: Any) -> TestCounts | None:
    if not isinstance(status, dict):
        return None
    return TestCounts(passed=len(status.get("success") or []), failed=len(status.get("failure") or []))
