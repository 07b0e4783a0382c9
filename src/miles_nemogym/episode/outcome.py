"""What came back from ``/run`` (or went wrong before it), as the episode's ``Outcome``.

The server answers HTTP 200 also for a crashed episode, with ``reward: 0.0``; every path
here ends in a valid measurement or a named, masked failure (docs/episode-pipeline.md).
``finish`` is the last step of every episode. Pure functions over bytes and parsed models.
"""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic_core
from pydantic import ValidationError

from miles_nemogym import failure_kinds as fk
from miles_nemogym.episode.protocol import OutputItem, RunResponse
from miles_nemogym.episode.record import (
    AGENT_METRICS_KEY,
    EVAL_REPORT_KEY,
    RECORD_KEY,
    REWARD_KEY,
    EpisodeRecord,
    TestCounts,
)
from miles_nemogym.episode.request import PolicyUrlError, RequestBuildError
from miles_nemogym.redaction import KeyScrubber, redact_urls
from miles_nemogym.settings import SettingsError

__all__ = [
    "Outcome",
    "check_reward",
    "classify_http",
    "classify_run_response",
    "failure",
    "failure_of",
    "finish",
    "instance_report",
    "short_reason",
]

logger = logging.getLogger(__name__)

_REASON_MAX_CHARS = 300
_DEFAULT_REWARD_RANGE = (0.0, 1.0)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class Outcome:
    """One finished (or failed) episode: what the agent function returns, and what it keeps."""

    reward: float
    record: EpisodeRecord
    eval_report: dict[str, Any] = field(default_factory=dict)
    answer: bytes | None = None
    """The ``/run`` answer as received, for the episode store only (which scrubs the key)."""
    answer_is_json: bool = False
    """Whether ``answer`` parsed as a ``/run`` result."""
    outage_wait_s: float = 0.0
    """Seconds this episode waited for an unreachable server (charged to its role's tally)."""
    tool_time_s: float | None = None
    """Seconds of an environment episode spent in seed, tool and verify requests; None for ``/run``."""

    def to_metadata(self) -> dict[str, Any]:
        """The dict returned to Miles and merged into ``sample.metadata``; with ``agent_metrics``
        when the tool time is known (Miles' ``non_generation_time``)."""
        result = {
            REWARD_KEY: self.reward,
            EVAL_REPORT_KEY: self.eval_report,
            RECORD_KEY: self.record.model_dump(mode="json"),
        }
        if self.tool_time_s is not None:
            result[AGENT_METRICS_KEY] = {"total_tool_time": self.tool_time_s}
        return result


def classify_http(
    status: int,
    body: bytes,
    *,
    instance_id: str | None = None,
    reward_range: tuple[float, float] = _DEFAULT_REWARD_RANGE,
    scrub: Callable[[bytes], bytes] | None = None,
) -> Outcome:
    """The ``Outcome`` of any HTTP answer from ``/run``: status code first, then the body. ``scrub``
    (the API key's) is applied before anything is parsed, quoted or cut."""
    if scrub is not None and status != 200:
        body = scrub(body)
    if status >= 500:
        return failure(fk.AGENT_RUN_ERROR, f"HTTP {status}: {_error_detail(body)}", http_status=status)
    if status >= 400:
        return failure(fk.AGENT_REQUEST_FAILED, f"HTTP {status}: {_error_detail(body)}", http_status=status)
    if status != 200:
        return failure(fk.AGENT_RUN_ERROR, f"unexpected HTTP {status} from /run", http_status=status)
    try:
        response = RunResponse.model_validate_json(body)
    except ValidationError as error:
        if scrub is not None and scrub(body) != body:  # what is quoted below might hold it
            return classify_http(status, scrub(body), instance_id=instance_id, reward_range=reward_range)
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        return failure(
            fk.AGENT_RUN_ERROR,
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


def _scrub_kept(response: RunResponse, scrub: Callable[[bytes], bytes]) -> RunResponse | None:
    """``response`` with ``scrub`` applied to the parts the outcome keeps or quotes (re-encoded,
    since parsing decoded their escapes); None when they cannot be re-encoded."""
    kept = {
        "reward": response.reward,
        "instance_id": response.instance_id,
        "metadata": response.metadata,
        "failure_kind": response.failure_kind,
        "failure_reason": response.failure_reason,
    }
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
        return body[:_REASON_MAX_CHARS].decode("utf-8", "replace")
    detail = parsed.get("detail", parsed) if isinstance(parsed, dict) else parsed
    return json.dumps(detail)[: _REASON_MAX_CHARS * 2]


def classify_run_response(
    response: RunResponse,
    *,
    http_status: int = 200,
    sent_instance_id: str | None = None,
    reward_range: tuple[float, float] = _DEFAULT_REWARD_RANGE,
) -> Outcome:
    """The ``Outcome`` of a ``/run`` result that parsed; a result for another instance than
    ``sent_instance_id`` or a reward outside ``reward_range`` is not a measurement."""
    metadata = _finite_json(response.metadata or {})
    raw_id = response.instance_id or metadata.get("instance_id")
    reported_id = None if raw_id is None else str(raw_id)
    instance_id = sent_instance_id if sent_instance_id is not None else reported_id
    output = response.response.output if response.response else []
    turns, tool_calls = _count_turns(output)
    server_reward, reward_problem = check_reward(response.reward, reward_range)
    server_kind = response.failure_kind
    if server_kind is not None and not fk.check_server_kind(server_kind):
        server_kind = None

    def failed(kind: str, reason: str) -> Outcome:
        outcome = failure(
            kind,
            reason,
            instance_id=instance_id,
            http_status=http_status,
            eval_report=metadata,
            server_reward=server_reward,
        )
        outcome.record.turns, outcome.record.tool_calls = turns, tool_calls
        return outcome

    if response.failure_kind is not None and server_kind is None:
        return failed(
            fk.AGENT_RUN_ERROR,
            f"the server sent an invalid failure_kind {_shown(short_reason(response.failure_kind))} "
            f"(not a known kind or a short identifier); its reason: {response.failure_reason or 'none'}",
        )
    if response.mask_sample:
        return failed(
            server_kind or fk.AGENT_RUN_ERROR,
            response.failure_reason or "the server marked the sample as not a valid measurement",
        )
    if "error" in metadata:
        return failed(server_kind or fk.AGENT_RUN_ERROR, f"server error: {_error_summary(metadata['error'])}")
    if sent_instance_id is not None and reported_id is not None and not _same_instance(reported_id, sent_instance_id):
        return failed(
            fk.AGENT_RUN_ERROR,
            f"the result is for instance {_shown(reported_id)}, not for {sent_instance_id!r} that was sent",
        )
    if reward_problem is not None:
        return failed(fk.AGENT_RUN_ERROR, reward_problem)
    report = instance_report(metadata, instance_id)
    if report is None:
        return failed(
            server_kind or fk.AGENT_RUN_ERROR,
            "the server's result has no SWE-bench eval report for this instance, so its reward cannot be trusted",
        )
    tests = report.get("tests_status") or {}
    record = EpisodeRecord(
        status="ok",
        failure_kind=server_kind,
        failure_reason=short_reason(response.failure_reason) if response.failure_reason else None,
        http_status=http_status,
        instance_id=instance_id,
        server_reward=server_reward,
        resolved=bool(report.get("resolved", False)),
        patch_applied=bool(report.get("patch_successfully_applied", False)),
        fail_to_pass=_test_counts(tests.get("FAIL_TO_PASS")),
        pass_to_pass=_test_counts(tests.get("PASS_TO_PASS")),
        turns=turns,
        tool_calls=tool_calls,
    )
    return Outcome(reward=server_reward or 0.0, eval_report=metadata, record=record)


def failure(
    kind: str,
    reason: str,
    *,
    instance_id: str | None = None,
    http_status: int | None = None,
    eval_report: dict[str, Any] | None = None,
    server_reward: float | None = None,
) -> Outcome:
    """A failed episode: reward 0.0, masked, named."""
    return Outcome(
        reward=0.0,
        eval_report=eval_report or {},
        record=EpisodeRecord(
            status="failed",
            failure_kind=kind,
            failure_reason=short_reason(reason),
            mask_sample=True,
            http_status=http_status,
            instance_id=instance_id,
            server_reward=server_reward,
        ),
    )


def failure_of(error: Exception, instance_id: str | None, scrubber: KeyScrubber | None = None) -> Outcome:
    """The failed ``Outcome`` for an exception raised on our side: a bad setting or request,
    else a defect (``client_error``, logged with its traceback)."""
    if isinstance(error, SettingsError):
        kind, reason = fk.INVALID_CONFIG, str(error)
    elif isinstance(error, (RequestBuildError, PolicyUrlError)):
        kind, reason = fk.INVALID_REQUEST, str(error)
    else:
        logger.error("miles-nemogym client error for %s", instance_id, exc_info=error)
        kind, reason = fk.CLIENT_ERROR, f"{type(error).__name__}: {error}"
    return failure(kind, reason if scrubber is None else scrubber.scrub_text(reason))


def finish(outcome: Outcome, instance_id: str | None) -> Outcome:
    """The last step of every episode: its own ``episode_id`` and the task's ``instance_id``."""
    outcome.record.episode_id = uuid.uuid4().hex
    if outcome.record.instance_id is None:
        outcome.record.instance_id = instance_id
    return outcome


def short_reason(text: str) -> str:
    """One line, bounded, no terminal colour codes, no URL password: reasons go into sample
    metadata and logs."""
    line = " ".join(redact_urls(_ANSI.sub("", str(text))).split())
    return line if len(line) <= _REASON_MAX_CHARS else line[: _REASON_MAX_CHARS - 1] + "…"


def instance_report(metadata: dict[str, Any] | None, instance_id: str | None) -> dict[str, Any] | None:
    """The SWE-bench report of this instance inside the server's metadata, if graded.

    With no ``instance_id`` to look for, a lone report is taken as the episode's."""
    if not metadata or not isinstance(metadata.get("eval_report"), dict):
        return None
    reports: dict[str, Any] = metadata["eval_report"]
    if instance_id is None:
        report = next(iter(reports.values())) if len(reports) == 1 else None
    else:
        report = reports.get(instance_id)
        if report is None:
            report = next(
                (v for k, v in reports.items() if isinstance(k, str) and _same_instance(k, instance_id)), None
            )
    return report if isinstance(report, dict) else None


def _error_summary(error: object) -> str:
    """The exception line of a crashed episode's ``metadata.error``: the last line, since
    the real server's errors are Ray-wrapped (colour codes and a traceback come first)."""
    lines = [line.strip() for line in _ANSI.sub("", str(error)).splitlines() if line.strip()]
    return lines[-1] if lines else "no error text"


def _count_turns(output: Sequence[OutputItem]) -> tuple[int, int]:
    """(model turns, tool calls) in a Responses ``output`` list: a turn is a run of items
    (message, reasoning, function_call...) ending where ``function_call_output`` answers it."""
    turns = 0
    tool_calls = 0
    in_turn = False
    for item in output:
        kind = item.get("type")
        if kind == "function_call_output":
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
    return TestCounts(
        passed=len(status.get("success") or []),
        failed=len(status.get("failure") or []),
    )


def _same_instance(a: str, b: str) -> bool:
    """Whether two instance ids name one instance (nemo-gym lowercases the ids it reports)."""
    return a == b or a.casefold() == b.casefold()


def _shown(value: Any, limit: int = 60) -> str:
    """A bounded, one-line ``repr`` of a value the server sent, for a failure reason."""
    try:
        text = repr(value)
    except ValueError:  # an integer too long to print
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_reward(value: Any, reward_range: tuple[float, float]) -> tuple[float | None, str | None]:
    """(the reward as a finite float or None, what is wrong with it or None): finite and in
    ``reward_range`` (``NEMO_GYM_REWARD_RANGE``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"the server's reward is not a number ({_shown(value)})"
    try:
        number = float(value)
    except OverflowError:  # a JSON integer beyond float range
        return None, f"the server's reward is not finite ({_shown(value)})"
    if not math.isfinite(number):
        return None, f"the server's reward is not finite ({number})"
    low, high = reward_range
    if not low <= number <= high:
        return number, f"the server's reward {number:g} is outside NEMO_GYM_REWARD_RANGE={low:g},{high:g}"
    return number, None


def _finite_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its name ("nan", "inf"): records
    must serialize as strict JSON, and a lenient parser lets ``NaN`` or ``1e999`` in."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {key: _finite_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite_json(item) for item in value]
    return value
