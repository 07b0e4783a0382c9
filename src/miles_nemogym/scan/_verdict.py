"""One scanned instance's verdict: passed, failed, or an infrastructure failure — and why."""

from __future__ import annotations

from enum import Enum
from typing import Any

from miles_nemogym.episode.record import SWE_ENVIRONMENT, Outcome, passed
from miles_nemogym.store.views import reward_text
from miles_nemogym.store.views import verdict as verdict_word

__all__ = ["Verdict", "golden_pair", "judge"]

_MAX_TEST_NAMES = 3


class Verdict(str, Enum):
    passed = "passed"
    failed = "failed"
    infra = "infra"


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


WRONG_ANSWER_PASSED = "wrong_answer_passed"  # a golden environment row whose wrong answer passed


def _graded_reason(outcome: Outcome) -> str:
    """Why a graded episode without a status did not score 1.0, from its SWE-bench report or its verifier."""
    record = outcome.record
    if record.env != SWE_ENVIRONMENT:
        said = f": {record.failure_reason}" if record.failure_reason else ""
        return f"{record.env}'s verifier scored {reward_text(outcome.reward)}{said}"
    report = outcome.instance_report() or {}
    if report.get("patch_exists") is False or report.get("patch_is_None") is True:
        return "no patch was submitted (patch_exists=false)"
    if report.get("patch_successfully_applied") is False:
        return "the patch did not apply (patch_successfully_applied=false)"
    failing = [part for part in (_failing(report, "FAIL_TO_PASS"), _failing(report, "PASS_TO_PASS")) if part]
    if failing:
        return "tests failing: " + "; ".join(failing)
    if report.get("resolved") is False:
        return "not resolved (resolved=false) and no failing test reported"
    return f"reward {reward_text(outcome.reward)} although the report says resolved"


def judge(outcome: Outcome) -> tuple[Verdict, str, str | None]:
    """(verdict, kind, reason): infra for a set-aside episode, else passed by the one "passed" rule
    (``record.passed``); kind is ``-``, the failure kind (or a valid record's status), ``unresolved`` or ``failed``;
    reason is ``None`` for a passed instance, else one line saying why it did not pass."""
    record = outcome.record
    if not record.mask_sample and passed(record, outcome.reward):
        return Verdict.passed, "-", None
    verdict = Verdict.infra if record.mask_sample else Verdict.failed
    if record.mask_sample or record.failure_kind:  # a valid record's status too
        # The classifier already reduced a crashed episode's error to its exception line.
        return verdict, record.failure_kind or "unknown", record.failure_line()
    kind = verdict_word(masked=False, failure_kind=None, swe=record.env == SWE_ENVIRONMENT, passed=False)
    return verdict, kind, _graded_reason(outcome)


def golden_pair(gold: Outcome, wrong: Outcome) -> tuple[Verdict, str, str | None]:
    """(verdict, kind, reason) of an environment row's gold and wrong answers: failed unless only the gold passed."""
    (gold_verdict, gold_kind, gold_reason), (wrong_verdict, wrong_kind, wrong_reason) = judge(gold), judge(wrong)
    if gold_verdict is Verdict.infra:
        return gold_verdict, gold_kind, gold_reason
    if wrong_verdict is Verdict.infra:
        return Verdict.infra, wrong_kind, f"the wrong answer's episode: {wrong_reason}"
    if gold_verdict is not Verdict.passed:
        return Verdict.failed, gold_kind, f"the row's gold answer did not pass: {gold_reason}"
    if wrong_verdict is Verdict.passed:
        said = f"a wrong answer scored {reward_text(wrong.reward)}"
        return Verdict.failed, WRONG_ANSWER_PASSED, f"{said}: the verifier passes an answer that is not the row's gold"
    return Verdict.passed, "-", None
