"""The episode record on every sample (``metadata["nemogym"]``) and its one reader.

The agent function writes it; the reward hook, the group filter, the metrics, the eval
metrics, the episode store and the smoke run read it back with ``read_record``, so every
field is named here only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

RECORD_KEY = "nemogym"
"""The ``sample.metadata`` key holding the record."""
REWARD_KEY = "reward"
"""The ``sample.metadata`` key holding the episode's final reward."""
EVAL_REPORT_KEY = "eval_report"
"""The ``sample.metadata`` key holding the server's result metadata."""


class TestCounts(BaseModel):
    """Passing and failing tests of one SWE-bench category."""

    __test__ = False  # not a pytest test class
    passed: int = Field(0, ge=0, description="Tests of the category that pass after the patch.")
    failed: int = Field(0, ge=0, description="Tests of the category that fail after the patch.")

    @property
    def fraction(self) -> float | None:
        """The share of passing tests; None when the category has no tests."""
        total = self.passed + self.failed
        return self.passed / total if total else None


class EpisodeRecord(BaseModel):
    """What happened to one ``/run`` episode, on every sample it produced."""

    status: Literal["ok", "failed"] = Field(description="ok: the server graded the episode; failed: it did not.")
    episode_id: str | None = Field(
        None, description="One id per /run call; the samples Miles splits one episode into share it."
    )
    failure_kind: str | None = Field(None, description="A name from failure_kinds.py; set for every failure.")
    failure_reason: str | None = Field(None, description="One bounded line saying what went wrong.")
    mask_sample: bool = Field(False, description="True: not a valid measurement; the sample is set aside.")
    http_status: int | None = Field(None, description="The HTTP status of /run's answer; None when none came.")
    attempts: int = Field(0, ge=0, description="Requests started; 0 means nothing was sent.")
    elapsed_s: float = Field(0.0, ge=0, allow_inf_nan=False, description="Seconds from the first send to the end.")
    instance_id: str | None = Field(None, description="The task instance the episode was for.")
    server_reward: float | None = Field(
        None, allow_inf_nan=False, description="The reward the server sent, kept for diagnosis even when unused."
    )
    resolved: bool | None = Field(None, description="Whether SWE-bench grading resolved the instance.")
    patch_applied: bool | None = Field(None, description="Whether the agent's patch applied to the repository.")
    fail_to_pass: TestCounts | None = Field(None, description="FAIL_TO_PASS tests after the patch.")
    pass_to_pass: TestCounts | None = Field(None, description="PASS_TO_PASS tests after the patch.")
    turns: int | None = Field(None, ge=0, description="Model turns of the episode.")
    tool_calls: int | None = Field(None, ge=0, description="Tool calls the model made.")


@dataclass(frozen=True)
class RecordRead:
    """A sample's record as read: the typed record, or why there is none."""

    record: EpisodeRecord | None
    problem: str | None = None
    """Why ``record`` is None: ``missing_record`` or ``not_an_object``."""
    unreadable: frozenset[str] = frozenset()
    """Fields present with a wrong type or value, read as their default instead."""


_STATUSES = ("ok", "failed")


def read_record(metadata: Any) -> RecordRead:
    """The typed record in a sample's metadata, or why there is none; never raises. A wrong
    field is named in ``unreadable`` and read as its default; a non-bool ``mask_sample``
    sets the record aside (docs/episode-pipeline.md)."""
    return parse_record(metadata.get(RECORD_KEY) if isinstance(metadata, Mapping) else None)


def parse_record(raw: Any) -> RecordRead:
    """``read_record`` for the record itself (as the episode store keeps it)."""
    if raw is None:
        return RecordRead(None, "missing_record")
    if not isinstance(raw, Mapping):
        return RecordRead(None, "not_an_object")
    fields = {key: value for key, value in raw.items() if key in EpisodeRecord.model_fields}
    unreadable: set[str] = set()
    if not isinstance(fields.get("mask_sample", False), bool):
        fields["mask_sample"] = True  # unknown validity: never train on it
        unreadable.add("mask_sample")
    if fields.get("status") not in _STATUSES:
        if "status" in fields:
            unreadable.add("status")
        fields["status"] = "failed" if fields.get("mask_sample") else "ok"
    try:
        return RecordRead(EpisodeRecord.model_validate(fields, strict=True), unreadable=frozenset(unreadable))
    except ValidationError as error:
        wrong = {str(item["loc"][0]) for item in error.errors() if item["loc"]}
    unreadable |= wrong
    readable = {key: value for key, value in fields.items() if key not in wrong}
    return RecordRead(EpisodeRecord.model_validate(readable, strict=True), unreadable=frozenset(unreadable))
