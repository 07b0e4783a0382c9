"""What a sample's metadata holds of ours: the episode record (``metadata["nemogym"]``), its one
reader, the train/eval marks, and how the hooks read Miles ``Sample`` objects.

The agent function writes the record; the reward hook, the group filter, salvage, the
metrics, the episode store and the smoke run read it back with ``read_record``, so every
field is named here only. Samples are read without importing Miles (``miles/utils/types.py``
at 31f1ca9): only ``Sample.metadata`` and ``Sample.status``, nested lists accepted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

__all__ = [
    "AGENT_METRICS_KEY",
    "AGENT_SUFFIX",
    "ENV_KEY",
    "EVAL",
    "EVAL_REPORT_KEY",
    "RECORD_KEY",
    "REWARD_KEY",
    "ROLE_KEYS",
    "ROW_MARKS",
    "SWE_ENVIRONMENT",
    "TASK_ID_KEY",
    "TRAIN",
    "EpisodeRecord",
    "RecordRead",
    "SampledEpisode",
    "TestCounts",
    "distinct_episodes",
    "environment_of",
    "eval_overrides",
    "flatten",
    "is_aborted",
    "metadata_of",
    "parse_record",
    "read_record",
    "record_of",
    "role_of",
    "task_id_of",
]

RECORD_KEY = "nemogym"
"""The ``sample.metadata`` key holding the record."""
REWARD_KEY = "reward"
"""The ``sample.metadata`` key holding the episode's final reward."""
EVAL_REPORT_KEY = "eval_report"
"""The ``sample.metadata`` key holding the server's result metadata."""
AGENT_METRICS_KEY = "agent_metrics"
"""The key of the agent function's dict whose ``total_tool_time`` Miles reads as the sample's
``non_generation_time`` (``miles/rollout/generate_hub/agentic_tool_call.py`` at 31f1ca9)."""

# Miles' ``--eval-config`` adds ``metadata_overrides`` to every eval sample (Miles
# ``miles/utils/eval_config.py`` at 31f1ca9); the launcher sets these two marks.
_ROLE_KEY = "nemogym_role"
_EVAL_SET_KEY = "nemogym_eval_set"
ROLE_KEYS = frozenset({_ROLE_KEY, _EVAL_SET_KEY})
"""The train/eval marks: ours, never sent to the server as task fields."""
TRAIN = "train"
EVAL = "eval"

# `miles-nemogym convert` marks each NeMo-Gym task row with its environment and a task id.
ENV_KEY = "nemogym_env"
"""The ``sample.metadata`` mark naming the row's environment (a ``NEMO_GYM_ENVS`` name)."""
TASK_ID_KEY = "nemogym_task_id"
"""The ``sample.metadata`` mark holding the row's task id (an environment row has no ``instance_id``)."""
ROW_MARKS = ROLE_KEYS | {ENV_KEY, TASK_ID_KEY}
"""Every mark of ours on a row: never sent to a server as task fields."""
AGENT_SUFFIX = "_simple_agent"
"""NeMo-Gym names environment X's ``simple_agent`` ``X_simple_agent`` (in its configs and in
rows' ``agent_ref``): the one rule from an agent's name to an environment's."""
SWE_ENVIRONMENT = "swe"
"""The environment of rows run through ``mini_swe_agent_2``'s ``/run`` (``NEMO_GYM_URL``);
reserved: ``NEMO_GYM_ENVS`` cannot name it."""


def environment_of(metadata: Mapping[str, Any] | None) -> str:
    """The environment a sample's row is marked with; ``swe`` when unmarked."""
    name = metadata.get(ENV_KEY) if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) and name else SWE_ENVIRONMENT


def task_id_of(metadata: Mapping[str, Any] | None) -> str | None:
    """The task a sample's row is for: its ``nemogym_task_id`` mark, else its ``instance_id``
    (SWE rows); text, a lone surrogate escaped."""
    if not isinstance(metadata, Mapping):
        return None
    raw = metadata.get(TASK_ID_KEY)
    if raw is None or raw == "":
        raw = metadata.get("instance_id")
    if raw is None:
        return None
    text = str(raw)
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def role_of(metadata: Mapping[str, Any] | None) -> tuple[str, str | None]:
    """(``"train"`` or ``"eval"``, the eval set's name) of a sample's metadata."""
    if not isinstance(metadata, Mapping) or metadata.get(_ROLE_KEY) != EVAL:
        return TRAIN, None
    name = metadata.get(_EVAL_SET_KEY)
    return EVAL, str(name) if name else "eval"


def eval_overrides(name: str) -> dict[str, str]:
    """The ``metadata_overrides`` that mark every sample of eval set ``name``."""
    return {_ROLE_KEY: EVAL, _EVAL_SET_KEY: name}


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
    environment: str | None = Field(
        None,
        description="The episode's environment: a NEMO_GYM_ENVS name or 'swe'; None (older records) reads as 'swe'.",
    )

    @property
    def env(self) -> str:
        """``environment``, with ``swe`` for records that have none."""
        return self.environment or SWE_ENVIRONMENT


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


# -- reading Miles samples --------------------------------------------------------------


def flatten(samples: Any) -> Iterator[Any]:
    """Every sample in ``samples``: one sample, a list of them, or a list of lists."""
    if isinstance(samples, (list, tuple)):
        for item in samples:
            yield from flatten(item)
    elif samples is not None:
        yield samples


def metadata_of(sample: Any) -> dict[str, Any]:
    """``sample.metadata``, or an empty dict when it has none."""
    metadata = getattr(sample, "metadata", None)
    return metadata if isinstance(metadata, dict) else {}


def record_of(sample: Any) -> EpisodeRecord | None:
    """The episode record the agent function wrote on ``sample``, if any."""
    return read_record(metadata_of(sample)).record


def is_aborted(sample: Any) -> bool:
    """Whether ``sample.status`` is Miles' ``Sample.Status.ABORTED``."""
    status = getattr(sample, "status", None)
    name = getattr(status, "name", None) or getattr(status, "value", None) or status
    return isinstance(name, str) and name.lower() == "aborted"


@dataclass(frozen=True)
class SampledEpisode:
    """One distinct episode among a rollout's samples."""

    record: EpisodeRecord
    unreadable: frozenset[str]
    """Record fields of a wrong type or value (see ``read_record``)."""
    metadata: dict[str, Any]
    """The metadata of its first sample (the task row: ``repo``, ...)."""


def distinct_episodes(samples: Iterable[Any]) -> list[SampledEpisode]:
    """The distinct episodes among ``samples`` (one episode may span samples), in order;
    a record without a readable ``episode_id`` is an episode of its own."""
    seen: set[str] = set()
    out = []
    for sample in samples:
        metadata = metadata_of(sample)
        read = read_record(metadata)
        if read.record is None:
            continue
        episode_id = read.record.episode_id
        if episode_id is not None:
            if episode_id in seen:
                continue
            seen.add(episode_id)
        out.append(SampledEpisode(read.record, read.unreadable, metadata))
    return out
