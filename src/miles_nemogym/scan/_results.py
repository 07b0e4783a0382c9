"""The scan's results: each instance's verdict (passed, failed, infra) and why, and the results file (one JSON
line per finished instance, appended, flushed and fsynced)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from miles_nemogym.episode.record import SWE_ENVIRONMENT, Outcome, passed
from miles_nemogym.scan._inputs import InputError
from miles_nemogym.store.views import reward_text
from miles_nemogym.store.views import verdict as verdict_word

__all__ = ["Mode", "ResultLine", "ResultsLock", "ResultsWriter", "Verdict", "golden_pair", "task_digest", "verdict_of"]

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


def verdict_of(outcome: Outcome) -> tuple[Verdict, str, str | None]:
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
    gold_verdict, gold_kind, gold_reason = verdict_of(gold)
    wrong_verdict, wrong_kind, wrong_reason = verdict_of(wrong)
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


Mode = Literal["golden", "policy", "server"]
"""``golden``: gold patches (every reward must be 1.0); ``policy``: ``--policy-base-url``'s model;
``server``: the server's own model (older results files only)."""


class ResultLine(BaseModel):
    """One line of the results file. Unknown keys are kept (newer writers)."""

    model_config = ConfigDict(extra="allow")

    instance_id: str
    repo: str = "?"
    verdict: Verdict
    reward: float
    seconds: float = 0.0
    failure_kind: str | None = None
    reason: str | None = None
    mode: Mode | None = None
    finished_at: str | None = None
    task_sha256: str | None = None  # task_digest of the row it ran from (absent in older files)
    nemogym: dict[str, Any] = Field(default_factory=dict)  # the episode record, as stored on a sample
    eval_report: dict[str, Any] = Field(default_factory=dict)  # the server's or verifier's result metadata
    environment: str | None = None  # an environment row's NEMO_GYM_ENVS name; None: a SWE-bench instance
    wrong_reward: float | None = None  # a golden scan of environment rows: the wrong answer's reward


def task_digest(metadata: dict[str, Any]) -> str:
    """A stable digest of one task row (the ``/run`` body's source), key order ignored."""
    text = json.dumps(metadata, sort_keys=True, ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


class ResultsLock:
    """The results file, opened once (never through a link), locked (``fd``) from its read until the scan ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fd = os.open(path, flags | os.O_EXCL, 0o666)
                self._created = True
            except FileExistsError:
                self.fd = os.open(path, flags, 0o666)
                self._created = False
        except OSError as error:
            if error.errno == errno.ELOOP or path.is_symlink():
                raise InputError(
                    f"--output {path}: is a symbolic link, which a scan never writes through; "
                    f"give its target ({path.resolve()}) or a new file"
                ) from None
            raise InputError(
                f"--output {path}: cannot create or open the results file ({error.strerror or error}); "
                "choose a file in a folder you can write to"
            ) from None
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            raise InputError(f"--output {path}: is not a regular file; give a file path")
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise InputError(
                f"--output {path}: another scan is writing this results file (it holds the file's "
                "lock); wait for it to finish, or give this scan another --output file"
            ) from None

    def read(self) -> dict[str, ResultLine]:
        """The lines already in the locked file, by instance id."""
        try:
            text = _contents(self.fd).decode("utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise InputError(f"--output {self.path}: cannot read the results file ({error})") from None
        return _parse_results(self.path, text)

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            if self._created and os.fstat(self.fd).st_size == 0:
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = -1


def _contents(fd: int) -> bytes:
    with open(fd, "rb", closefd=False) as file:  # writes are positioned (pwrite): the offset is free to move
        file.seek(0)
        return file.read()


def _parse_results(path: Path, text: str) -> dict[str, ResultLine]:
    lines = text.split("\n")
    results: dict[str, ResultLine] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            result = ResultLine.model_validate_json(line)
        except ValidationError as error:
            torn_tail = number == len(lines) and not text.endswith("\n")
            if torn_tail:
                continue  # the write a crash interrupted; that instance runs again
            first = error.errors()[0]
            raise InputError(
                f"--output {path}:{number}: not a scan result line ({first['msg']}); give a new "
                "--output file or the one an earlier scan wrote"
            ) from None
        results[result.instance_id] = result  # a later line wins
    return results


class ResultsWriter:
    """Appends one line per finished instance through the lock's descriptor, durably, before it is reported."""

    def __init__(self, lock: ResultsLock) -> None:
        self._fd = lock.fd
        self._end = os.fstat(self._fd).st_size
        if self._end and os.pread(self._fd, 1, self._end - 1) != b"\n":
            data = _contents(self._fd)
            line_start = data.rfind(b"\n") + 1
            try:  # a whole result missing only its newline was read as finished: keep it
                ResultLine.model_validate_json(data[line_start:])
                self._end += os.pwrite(self._fd, b"\n", self._end)
            except ValidationError:  # the torn line a crash left (``read`` ignored it too)
                self._end = line_start
                os.ftruncate(self._fd, line_start)

    def write(self, result: ResultLine) -> None:
        if result.finished_at is None:
            result.finished_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        data = (json.dumps(result.model_dump(mode="json"), sort_keys=True) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, self._end)
            self._end += written
            view = view[written:]
        os.fsync(self._fd)
