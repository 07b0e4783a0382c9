"""One scanned instance's verdict: passed, failed, or an infrastructure failure — and why.

The classification is the agent function's: a masked record is infrastructure, a graded
episode passed at reward 1.0. The reason points at what to look at (the SWE-bench report,
or the failure kind and the server's error).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from miles_nemogym.episode.record import Outcome, short_reason
from miles_nemogym.episode.run import instance_report

_MAX_TEST_NAMES = 3


class Verdict(str, Enum):
    passed = "passed"
    failed = "failed"
    infra = "infra"


def verdict_of(outcome: Outcome) -> Verdict:
    if outcome.record.status != "ok":
        return Verdict.infra
    return Verdict.passed if outcome.reward >= 1.0 else Verdict.failed


def _failing(report: dict[str, Any], category: str) -> str | None:
    status = (report.get("tests_status") or {}).get(category)
    if not isinstance(status, dict):
        return None
    failing = [str(name) for name in status.get("failure") or []]
    if not failing:
        return None
    total = len(failing) + len(status.get("success") or [])
    names = ", ".join(failing[:_MAX_TEST_NAMES])
    more = f" (+{len(failing) - _MAX_TEST_NAMES} more)" if len(failing) > _MAX_TEST_NAMES else ""
    return f"{category} {len(failing)}/{total} failing: {names}{more}"


def _graded_reason(outcome: Outcome) -> str:
    """Why a graded episode did not score 1.0, from its SWE-bench report."""
    record = outcome.record
    report = instance_report(outcome.eval_report, record.instance_id) or {}
    if report.get("patch_exists") is False or report.get("patch_is_None") is True:
        return "no patch was submitted (patch_exists=false)"
    if report.get("patch_successfully_applied") is False:
        return "the patch did not apply (patch_successfully_applied=false)"
    failing = [part for part in (_failing(report, "FAIL_TO_PASS"), _failing(report, "PASS_TO_PASS")) if part]
    if failing:
        return "tests failing: " + "; ".join(failing)
    if report.get("resolved") is False:
        return "not resolved (resolved=false) and no failing test reported"
    return f"reward {outcome.reward:g} although the report says resolved"


def reason_of(outcome: Outcome) -> str | None:
    """``None`` for a passed instance, else one line saying why it did not pass."""
    verdict = verdict_of(outcome)
    if verdict is Verdict.passed:
        return None
    if verdict is Verdict.infra:
        record = outcome.record
        # The classifier already reduced a crashed episode's error to its exception line.
        return short_reason(f"{record.failure_kind or 'unknown'}: {record.failure_reason or 'no reason given'}")
    return _graded_reason(outcome)


def kind_of(outcome: Outcome) -> str:
    """The short label of the per-instance line: ``-``, ``unresolved`` or the failure kind."""
    verdict = verdict_of(outcome)
    if verdict is Verdict.passed:
        return "-"
    if verdict is Verdict.infra:
        return outcome.record.failure_kind or "unknown"
    return "unresolved"
