"""Classify what came back from ``/run`` into the record Miles stores on the sample.

The server answers HTTP 200 whether the episode was graded or crashed, and a crashed
episode carries ``reward: 0.0`` — indistinguishable from a policy that failed the task
unless the body is read closely. Training on that zero would punish the policy for the
infrastructure, so every path here ends in an explicit verdict: either a valid
measurement (``mask_sample`` false, the server's reward) or a failure with a
``failure_kind`` from ``failure_kinds.py`` and ``mask_sample`` true (reward 0.0, and the
group filter sets the group aside).

Pure functions over bytes and parsed models; the client does the I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from miles_nemogym import failure_kinds as fk
from miles_nemogym.protocol import OutputItem, RunResponse

REASON_MAX_CHARS = 300


class TestCounts(BaseModel):
    """Passing and failing tests of one SWE-bench category."""

    __test__ = False  # not a pytest test class
    passed: int = 0
    failed: int = 0

    @property
    def fraction(self) -> float | None:
        total = self.passed + self.failed
        return self.passed / total if total else None


class EpisodeRecord(BaseModel):
    """``metadata["nemogym"]`` on every sample: what happened to its episode."""

    status: Literal["ok", "failed"]
    episode_id: str | None = None
    """One id per ``/run`` call. Miles may split one episode into several samples, each
    carrying this record; metrics count episodes by it."""
    failure_kind: str | None = None
    failure_reason: str | None = None
    mask_sample: bool = False
    http_status: int | None = None
    attempts: int = 0
    elapsed_s: float = 0.0
    instance_id: str | None = None
    server_reward: float | None = None
    """The reward the server sent, kept for diagnosis even when it is not used."""
    resolved: bool | None = None
    patch_applied: bool | None = None
    fail_to_pass: TestCounts | None = None
    pass_to_pass: TestCounts | None = None
    turns: int | None = None
    tool_calls: int | None = None


class Outcome(BaseModel):
    """The agent function's verdict on one episode."""

    reward: float
    eval_report: dict[str, Any] = Field(default_factory=dict)
    record: EpisodeRecord
    _answer: bytes | None = PrivateAttr(default=None)
    """The ``/run`` answer as received (API key scrubbed), for the episode store only."""
    _answer_is_json: bool = PrivateAttr(default=False)

    def with_answer(self, raw: bytes | None, *, is_json: bool) -> Outcome:
        """``self`` carrying the raw answer (not part of the sample's metadata)."""
        self._answer, self._answer_is_json = raw, is_json
        return self

    @property
    def answer(self) -> tuple[bytes | None, bool]:
        """(the raw ``/run`` answer or None, whether it parsed as a JSON result)."""
        return self._answer, self._answer_is_json

    def to_metadata(self) -> dict[str, Any]:
        """The dict returned to Miles and merged into ``sample.metadata``."""
        return {
            "reward": self.reward,
            "eval_report": self.eval_report,
            "nemogym": self.record.model_dump(mode="json"),
        }


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def short_reason(text: str) -> str:
    """One line, bounded, no terminal colour codes: reasons go into sample metadata and logs."""
    line = " ".join(_ANSI.sub("", str(text)).split())
    return line if len(line) <= REASON_MAX_CHARS else line[: REASON_MAX_CHARS - 1] + "…"


def error_summary(error: object) -> str:
    """The exception line of a crashed episode's ``metadata.error``.

    The real server's errors are Ray-wrapped: colour codes, the remote task's name and a
    traceback come first, and what failed (e.g. ``ConnectionError: ... Failed to resolve
    'raw.githubusercontent.com'``) is the last line, which a head-truncated reason loses.
    """
    lines = [line.strip() for line in _ANSI.sub("", str(error)).splitlines() if line.strip()]
    return lines[-1] if lines else "no error text"


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


def count_turns(output: Sequence[OutputItem]) -> tuple[int, int]:
    """(model turns, tool calls) in a Responses ``output`` list.

    One model turn produces a run of items (message, reasoning, function_call...) that
    ends where the harness answers with ``function_call_output``.
    """
    turns = 0
    tool_calls = 0
    in_turn = False
    for item in output:
        kind = item.type
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


def instance_report(metadata: dict[str, Any] | None, instance_id: str | None) -> dict[str, Any] | None:
    """The SWE-bench report of this instance inside the server's metadata, if graded."""
    if not metadata or not isinstance(metadata.get("eval_report"), dict):
        return None
    reports: dict[str, Any] = metadata["eval_report"]
    report = reports.get(instance_id) if instance_id else None
    if report is None and len(reports) == 1:
        report = next(iter(reports.values()))
    return report if isinstance(report, dict) else None


def classify_run_response(response: RunResponse, *, http_status: int = 200) -> Outcome:
    """Verdict on a ``/run`` result that parsed."""
    metadata = response.metadata or {}
    raw_id = response.instance_id or metadata.get("instance_id")
    instance_id = None if raw_id is None else str(raw_id)
    output = response.response.output if response.response else []
    turns, tool_calls = count_turns(output)

    def failed(kind: str, reason: str) -> Outcome:
        outcome = failure(
            kind,
            reason,
            instance_id=instance_id,
            http_status=http_status,
            eval_report=metadata,
            server_reward=response.reward,
        )
        outcome.record.turns, outcome.record.tool_calls = turns, tool_calls
        return outcome

    if response.mask_sample:
        return failed(
            response.failure_kind or fk.AGENT_RUN_ERROR,
            response.failure_reason or "the server marked the sample as not a valid measurement",
        )
    if "error" in metadata:
        return failed(response.failure_kind or fk.AGENT_RUN_ERROR, f"server error: {error_summary(metadata['error'])}")
    if not math.isfinite(response.reward):
        return failed(fk.AGENT_RUN_ERROR, f"the server's reward is not finite ({response.reward})")
    report = instance_report(metadata, instance_id)
    if report is None:
        return failed(
            response.failure_kind or fk.AGENT_RUN_ERROR,
            "the server's result has no SWE-bench eval report for this instance, so its reward cannot be trusted",
        )
    tests = report.get("tests_status") or {}
    record = EpisodeRecord(
        status="ok",
        failure_kind=response.failure_kind,
        failure_reason=short_reason(response.failure_reason) if response.failure_reason else None,
        http_status=http_status,
        instance_id=instance_id,
        server_reward=response.reward,
        resolved=bool(report.get("resolved", False)),
        patch_applied=bool(report.get("patch_successfully_applied", False)),
        fail_to_pass=_test_counts(tests.get("FAIL_TO_PASS")),
        pass_to_pass=_test_counts(tests.get("PASS_TO_PASS")),
        turns=turns,
        tool_calls=tool_calls,
    )
    return Outcome(reward=float(response.reward), eval_report=metadata, record=record)


def _error_detail(body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body[:REASON_MAX_CHARS].decode("utf-8", "replace")
    detail = parsed.get("detail", parsed) if isinstance(parsed, dict) else parsed
    return json.dumps(detail)[: REASON_MAX_CHARS * 2]


def classify_http(status: int, body: bytes) -> Outcome:
    """Verdict on any HTTP answer from ``/run``: status code first, then the body."""
    if status >= 500:
        return failure(fk.AGENT_RUN_ERROR, f"HTTP {status}: {_error_detail(body)}", http_status=status)
    if status >= 400:
        return failure(fk.AGENT_REQUEST_FAILED, f"HTTP {status}: {_error_detail(body)}", http_status=status)
    if status != 200:
        return failure(fk.AGENT_RUN_ERROR, f"unexpected HTTP {status} from /run", http_status=status)
    try:
        response = RunResponse.model_validate_json(body)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        return failure(
            fk.AGENT_RUN_ERROR,
            f"undecodable /run result ({where}: {first['msg']}); is NEMO_GYM_URL a mini_swe_agent_2 server?",
            http_status=status,
        )
    outcome = classify_run_response(response, http_status=status)
    outcome._answer_is_json = True
    return outcome
