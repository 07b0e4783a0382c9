"""What an episode leaves on its sample: the ``Outcome``, the record (``metadata["nemogym"]``) and its
one reader, the one judge, the "passed" rule with pass@k, a row's marks, and how hooks read Miles
samples (docs/episode-pipeline.md)."""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from miles_nemogym.errors import (
    AGENT_RUN_ERROR,
    AGENT_TIMEOUT,
    CLIENT_ERROR,
    INVALID_CONFIG,
    INVALID_REQUEST,
    POLICY_TIMEOUT,
    VERIFIER_ERROR,
    Failed,
    RequestError,
    SettingsError,
    check_server_kind,
    redact_urls,
)
from miles_nemogym.settings import SWE_ENVIRONMENT, Settings, TimeoutReward, environment_name_problem, short_name

__all__ = [
    "AGENT_SUFFIX",
    "BENCHMARK_KEY",
    "ENV_KEY",
    "ROUTING_KEYS",
    "SWE_ENVIRONMENT",
    "TASK_ID_KEY",
    "EpisodeRecord",
    "Outcome",
    "Task",
    "agent_environment",
    "eval_overrides",
    "finite",
    "parse_record",
    "pass_at_k",
    "passed",
    "percentile",
    "read_record",
]

logger = logging.getLogger(__name__)

# The keys of the agent function's dict (``agent_metrics.total_tool_time``: Miles' non_generation_time).
RECORD_KEY = "nemogym"
REWARD_KEY = "reward"
_EVAL_REPORT_KEY = "eval_report"
_AGENT_METRICS_KEY = "agent_metrics"

# Miles' ``--eval-config`` adds ``metadata_overrides`` to every eval sample (Miles
# ``miles/utils/eval_config.py`` at 31f1ca9); the launcher sets these two marks.
_ROLE_KEY = "nemogym_role"
_EVAL_SET_KEY = "nemogym_eval_set"
_ROLE_KEYS = frozenset({_ROLE_KEY, _EVAL_SET_KEY})
TRAIN = "train"
EVAL = "eval"

# `miles-nemogym convert` marks each NeMo-Gym task row with its environment and a task id.
ENV_KEY = "nemogym_env"
TASK_ID_KEY = "nemogym_task_id"  # an environment row has no instance_id
BENCHMARK_KEY = "nemogym_benchmark"  # a benchmark's row: its name, grader, repeats, reward range
ROW_MARKS = _ROLE_KEYS | {ENV_KEY, TASK_ID_KEY, BENCHMARK_KEY}  # our marks: never sent as task fields
ROUTING_KEYS = frozenset({"policy_base_url", "policy_api_key"})  # the plugin's, never a data row's
# Keys Miles adds to sample.metadata for its own bookkeeping (agentic_tool_call.py).
_MILES_BOOKKEEPING_KEYS = frozenset({"max_seq_len", "session_server_id", "session_server_instance_id"})
# Keys the agent function returns (Miles merges them into sample.metadata): never sent as task fields.
_RESULT_KEYS = frozenset({REWARD_KEY, _EVAL_REPORT_KEY, RECORD_KEY, _AGENT_METRICS_KEY})
_NOT_SENT_KEYS = _MILES_BOOKKEEPING_KEYS | _RESULT_KEYS | ROUTING_KEYS | ROW_MARKS


def task_row(metadata: object) -> dict[str, Any]:
    """The task row as a server gets it: without our marks, Miles' keys, the agent's result, routing."""
    if not isinstance(metadata, Mapping) or not metadata:
        raise RequestError(
            "sample metadata must be a dict holding the task row (a SWE row: instance_id, repo, base_commit, ...), "
            f"got {type(metadata).__name__ if metadata else 'nothing'}; convert the data with `miles-nemogym convert`"
        )
    return {key: value for key, value in metadata.items() if key not in _NOT_SENT_KEYS}


AGENT_SUFFIX = "_simple_agent"  # NeMo-Gym names environment X's simple_agent X_simple_agent
UNRECOGNIZED_ENVIRONMENT = "unrecognized"  # a row's environment when its mark is not an environment name
_AGENT_REF_KEY = "agent_ref"  # NeMo-Gym's row field naming the agent that runs it


@dataclass(frozen=True)
class Task:
    """A sample's row, read once where the agent function starts: later steps get this, not the metadata."""

    metadata: Any  # the row as Miles gave it (checked by each episode kind, never changed)
    environment: str  # its nemogym_env mark (else unrecognized), else its agent_ref's, else swe
    task_id: str | None  # its nemogym_task_id mark, else its instance_id; printable (escaped)
    role: str  # train, or eval for a sample Miles' --eval-config marked
    eval_set: str | None  # the eval set's name (eval when the mark names none); None for training

    @classmethod
    def of(cls, metadata: Any, environment: str | None = None) -> Task:
        """The task of ``metadata``; ``environment``: the caller's choice (a scan's ``--env``) over the marks."""
        mapping: Mapping[str, Any] = metadata if isinstance(metadata, Mapping) else {}
        evaluated = mapping.get(_ROLE_KEY) == EVAL
        return cls(
            metadata=metadata,
            environment=_environment_of(mapping) if environment is None else environment,  # no row: swe
            task_id=_task_id_of(mapping),
            role=EVAL if evaluated else TRAIN,
            eval_set=str(mapping.get(_EVAL_SET_KEY) or "eval") if evaluated else None,
        )

    @property
    def repo(self) -> str | None:
        repo = self.metadata.get("repo") if isinstance(self.metadata, Mapping) else None
        return repo if isinstance(repo, str) else None


def _environment_of(metadata: Mapping[str, Any]) -> str:
    if ENV_KEY in metadata:
        name = metadata[ENV_KEY]  # the catalog's spelling is its short name
        return env_label(short_name(name)) if isinstance(name, str) else UNRECOGNIZED_ENVIRONMENT
    ref = metadata.get(_AGENT_REF_KEY)  # ``X`` for {"type": "responses_api_agents", "name": "X_simple_agent"}
    if isinstance(ref, Mapping) and ref.get("type") == "responses_api_agents":
        return agent_environment(ref.get("name")) or SWE_ENVIRONMENT
    return SWE_ENVIRONMENT


def env_label(name: str) -> str:
    """``name`` if it is ``swe`` or can name an environment, else ``unrecognized`` (a row's mark, a metric path)."""
    return name if name == SWE_ENVIRONMENT or environment_name_problem(name) is None else UNRECOGNIZED_ENVIRONMENT


def agent_environment(agent: Any) -> str | None:
    """``X`` for NeMo-Gym's agent name ``X_simple_agent`` when ``X`` is an environment name, else None."""
    if not isinstance(agent, str) or not agent.endswith(AGENT_SUFFIX):
        return None
    name = agent.removesuffix(AGENT_SUFFIX)
    return name if environment_name_problem(name) is None else None


def _task_id_of(metadata: Mapping[str, Any]) -> str | None:
    raw = metadata.get(TASK_ID_KEY)
    if raw is None or raw == "":
        raw = metadata.get("instance_id")
    if raw is None:
        return None
    text = str(raw)
    # Shown in logs and terminals: control characters and lone surrogates escaped.
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


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
        total = self.passed + self.failed
        return self.passed / total if total else None


class EpisodeRecord(BaseModel):
    """What happened to one ``/run`` episode, on every sample it produced."""

    status: Literal["ok", "failed"] = Field(description="ok: a measurement (graded, or a policy timeout); failed: none")
    episode_id: str | None = Field(None, description="One id per episode; the samples Miles splits it into share it.")
    failure_kind: str | None = Field(None, description="A failure kind (errors.py); set for every failure.")
    failure_reason: str | None = Field(None, description="One bounded line saying what went wrong.")
    mask_sample: bool = Field(False, description="True: not a valid measurement; the sample is set aside.")
    http_status: int | None = Field(None, description="The HTTP status of /run's answer; None when none came.")
    attempts: int = Field(0, ge=0, description="Requests started; 0 means nothing was sent.")
    elapsed_s: float = Field(0.0, ge=0, allow_inf_nan=False, description="Seconds from the first send to the end.")
    instance_id: str | None = Field(None, description="The task instance the episode was for.")
    server_reward: float | None = Field(None, allow_inf_nan=False, description="The server's reward, even when unused.")
    resolved: bool | None = Field(None, description="Whether SWE-bench grading resolved the instance.")
    patch_applied: bool | None = Field(None, description="Whether the agent's patch applied to the repository.")
    fail_to_pass: TestCounts | None = Field(None, description="FAIL_TO_PASS tests after the patch.")
    pass_to_pass: TestCounts | None = Field(None, description="PASS_TO_PASS tests after the patch.")
    turns: int | None = Field(None, ge=0, description="Model turns of the episode.")
    tool_calls: int | None = Field(None, ge=0, description="Tool calls the model made.")
    environment: str | None = Field(None, description="A NEMO_GYM_ENVS name or 'swe'; None (older records): 'swe'.")

    @property
    def env(self) -> str:
        return self.environment or SWE_ENVIRONMENT

    def failure_line(self) -> str:
        """``kind: reason`` as one bounded line (``short_reason``), ``unknown`` / ``no reason given`` when unset."""
        return short_reason(f"{self.failure_kind or 'unknown'}: {self.failure_reason or 'no reason given'}")


# -- the outcome: what every episode kind ends in ----------------------------------------------

_REASON_MAX_CHARS = 300
# Terminal control sequences (CSI, OSC up to BEL or ST) and any other control character: reasons are shown.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|[\x00-\x1f\x7f-\x9f]")


@dataclass
class Outcome:
    """One finished (or failed) episode: what the agent function returns, and what it keeps."""

    reward: float
    record: EpisodeRecord
    eval_report: dict[str, Any] = field(default_factory=dict)
    answer: bytes | dict[str, Any] | None = None  # for the episode store: /run's bytes, or /verify's + transcript
    answer_is_json: bool = False  # whether answer is one JSON object
    outage_wait_s: float = 0.0  # seconds waited for an unreachable server (charged to its role's tally)
    tool_time_s: float | None = None  # an environment episode's seed, tool and verify requests; None for /run
    aborted: bool = False  # stopped by our abort: neither an episode nor a failure (a server's cancel is)

    def instance_report(self) -> dict[str, Any] | None:
        """The SWE-bench report of this episode's instance in the server's ``eval_report``, if graded."""
        return instance_report(self.eval_report, self.record.instance_id)

    def to_metadata(self) -> dict[str, Any]:
        """The dict returned to Miles, merged into ``sample.metadata`` (``agent_metrics`` when timed)."""
        result = {
            REWARD_KEY: self.reward,
            _EVAL_REPORT_KEY: self.eval_report,
            RECORD_KEY: self.record.model_dump(mode="json"),
        }
        if self.tool_time_s is not None:
            result[_AGENT_METRICS_KEY] = {"total_tool_time": self.tool_time_s}
        return result


def instance_report(metadata: dict[str, Any] | None, instance_id: str | None) -> dict[str, Any] | None:
    """The SWE-bench report of this instance in the server's metadata, if graded (a lone one without an id)."""
    if not metadata or not isinstance(metadata.get("eval_report"), dict):
        return None
    reports: dict[str, Any] = metadata["eval_report"]
    if instance_id is None:
        report = next(iter(reports.values())) if len(reports) == 1 else None
    else:
        report = reports.get(instance_id)
        if report is None:
            report = next((v for k, v in reports.items() if isinstance(k, str) and same_instance(k, instance_id)), None)
    return report if isinstance(report, dict) else None


def same_instance(a: str, b: str) -> bool:
    """Whether two instance ids name one instance (nemo-gym lowercases the ids it reports)."""
    return a == b or a.casefold() == b.casefold()


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


def failure_of(
    error: Exception, task_id: str | None, settings: Settings | None = None, *, lowest: float = 0.0
) -> Outcome:
    """The failed ``Outcome`` of any exception (a defect is ``client_error``, logged), scrubbed of the key."""
    if isinstance(error, Failed):
        kind, reason = error.kind, str(error)
    elif isinstance(error, SettingsError):
        kind, reason = INVALID_CONFIG, str(error)
    elif isinstance(error, RequestError):
        kind, reason = INVALID_REQUEST, str(error)
    else:
        logger.error("miles-nemogym client error for %s", task_id, exc_info=error)
        kind, reason = CLIENT_ERROR, f"{type(error).__name__}: {error}"
    if settings is not None:
        reason = settings.scrub_text(reason)
    if kind == AGENT_TIMEOUT and isinstance(error, Failed):
        given = TimeoutReward.mask if settings is None else settings.timeout_reward
        return timed_out(reason, policy=error.policy, given=given, lowest=lowest)
    outcome = failure(kind, reason)
    outcome.aborted = isinstance(error, Failed) and error.aborted
    return outcome


def finish(outcome: Outcome, task_id: str | None) -> Outcome:
    """The last step of every episode: its own ``episode_id`` and the task's id."""
    outcome.record.episode_id = uuid.uuid4().hex
    if outcome.record.instance_id is None:
        outcome.record.instance_id = task_id
    return outcome


def short_reason(text: str) -> str:
    """One bounded line without control codes or URL passwords: reasons go to metadata, logs, terminals."""
    line = " ".join(redact_urls(_CONTROL.sub(" ", str(text))).split())
    return line if len(line) <= _REASON_MAX_CHARS else line[: _REASON_MAX_CHARS - 1] + "…"


def shown(value: Any, limit: int = 60) -> str:
    """A bounded, one-line ``repr`` of a value a server or a row sent, for a failure reason."""
    try:
        text = repr(value)
    except ValueError:  # an integer too long to print
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


_RANGE_SETTING = "NEMO_GYM_REWARD_RANGE"


def range_setting(environment: str, server: Any) -> str:
    """The setting that gives ``environment``'s reward range (``server``: its ``EnvironmentServer``)."""
    return f"NEMO_GYM_ENVS[{environment!r}].reward_range" if server.reward_range is not None else _RANGE_SETTING


def finite(value: object) -> float | None:
    """``value`` as a finite float, or None (a boolean, NaN, an int past a float's range): the rule for a reward."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def row_extra_body(raw: Any, where: str) -> dict[str, Any]:
    """A row's ``metadata.extra_body`` (an object, or one as a JSON string) as a dict; else ``RequestError``."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as error:
            raise RequestError(f"{where} must be a JSON object encoded as a string: {error}") from None
        if not isinstance(raw, dict):
            raise RequestError(f"{where} must be a JSON object, got {type(raw).__name__}")
    if isinstance(raw, Mapping):
        return dict(raw)
    raise RequestError(f"{where} must be a JSON object encoded as a string, got {type(raw).__name__}")


def check_reward(
    value: Any, reward_range: tuple[float, float], setting: str = _RANGE_SETTING
) -> tuple[float | None, str | None]:
    """(the reward as a finite float or None, its problem or None): a number, finite, in ``reward_range``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"the server's reward is not a number ({shown(value)})"
    number = finite(value)
    if number is None:
        return None, f"the server's reward is not finite ({shown(value)})"
    low, high = reward_range
    if not low <= number <= high:
        shown_range = f"{low:g},{high:g}" if setting == _RANGE_SETTING else f"[{low:g}, {high:g}]"
        return number, f"the server's reward {number:g} is outside {setting}={shown_range}"
    return number, None


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float as its name ("nan", "inf"): what a sample carries is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite_json(item) for item in value]
    return value


# -- the one judge: a server's answer to a verdict ------------------------------------------


def judge(
    answer: Mapping[str, Any],
    *,
    reward_range: tuple[float, float],
    report: dict[str, Any],
    range_name: str = _RANGE_SETTING,
    who: str = "the server",
    http_status: int | None = None,
    instance_id: str | None = None,
    broken: str | None = None,
    graded: Mapping[str, Any] | None = None,
) -> Outcome:
    """The one judge of a server's parsed answer (docs/episode-pipeline.md, "One judge"): ``broken`` says why
    the kind's own fields make it no measurement, ``graded`` fills a valid record."""
    kind, said, mask = answer.get("failure_kind"), answer.get("failure_reason"), answer.get("mask_sample", False)
    named = kind if isinstance(kind, str) and check_server_kind(kind) else None
    reason = short_reason(str(said)) if said else None
    reward, problem = check_reward(answer.get("reward"), reward_range, range_name)
    default = VERIFIER_ERROR
    if not isinstance(mask, bool):
        problem = f"{who} sent a mask_sample that is not a boolean ({shown(mask)}): the reward's validity is unknown"
    elif kind is not None and named is None:
        shown_kind = shown(short_reason(kind) if isinstance(kind, str) else kind)
        problem = f"{who} sent an invalid failure_kind {shown_kind} (not a known kind or a short identifier)"
    elif mask:
        problem = reason or f"{who} marked the sample as not a valid measurement"
    elif problem is None and broken is not None:
        default, problem = AGENT_RUN_ERROR, broken
    if problem is not None:
        return failure(
            named or default,
            problem,
            instance_id=instance_id,
            http_status=http_status,
            eval_report=report,
            server_reward=reward,
        )
    record = EpisodeRecord(
        status="ok",
        failure_kind=named,
        failure_reason=reason,
        http_status=http_status,
        instance_id=instance_id,
        server_reward=reward,
        **(graded or {}),
    )
    return Outcome(reward=reward or 0.0, eval_report=report, record=record)


def timed_out(reason: str, *, policy: bool, given: TimeoutReward, lowest: float) -> Outcome:
    """An episode past its deadline (docs/episode-pipeline.md, "Whose fault is a timeout")."""
    if not policy or given is TimeoutReward.mask:
        return failure(AGENT_TIMEOUT, reason)
    record = EpisodeRecord(status="ok", failure_kind=POLICY_TIMEOUT, failure_reason=short_reason(reason))
    return Outcome(reward=lowest if given is TimeoutReward.lowest else 0.0, record=record)


@dataclass(frozen=True)
class RecordRead:
    """A sample's record as read: the typed record, or why there is none."""

    record: EpisodeRecord | None
    problem: str | None = None  # why record is None: missing_record or not_an_object
    unreadable: frozenset[str] = frozenset()  # fields of a wrong type or value, read as their default


def read_record(metadata: Any) -> RecordRead:
    """The typed record in a sample's metadata, or why there is none; never raises."""
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
    if fields.get("status") not in ("ok", "failed"):
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


PASS_REWARD = 1.0  # an environment episode passes with full credit; partial credit shows in the reward mean


def passed(record: EpisodeRecord, reward: object) -> bool:
    """The one "passed" rule: valid, and SWE resolved or another environment's reward >= ``PASS_REWARD``."""
    if record.mask_sample:
        return False
    if record.env == SWE_ENVIRONMENT:
        return bool(record.resolved)
    number = finite(reward)
    return number is not None and number >= PASS_REWARD


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of ``n`` valid episodes, ``c`` resolved: 1 - C(n-c, k) / C(n, k); needs ``n >= k``."""
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} episodes, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def flatten(samples: Any) -> Iterator[Any]:
    """Every sample in ``samples``: one sample, a list of them, or a list of lists."""
    if isinstance(samples, (list, tuple)):
        for item in samples:
            yield from flatten(item)
    elif samples is not None:
        yield samples


def metadata_of(sample: Any) -> dict[str, Any]:
    metadata = getattr(sample, "metadata", None)
    return metadata if isinstance(metadata, dict) else {}


def strip_result(metadata: dict[str, Any]) -> None:
    """Remove the agent function's dict from ``metadata`` (a regenerated prompt must not carry its record)."""
    for key in _RESULT_KEYS:
        metadata.pop(key, None)


def record_of(sample: Any) -> EpisodeRecord | None:
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
    unreadable: frozenset[str]  # record fields of a wrong type or value (see read_record)
    metadata: dict[str, Any]  # the metadata of its first sample (the task row: repo, ...)


def distinct_episodes(samples: Iterable[Any]) -> list[SampledEpisode]:
    """The distinct episodes among ``samples``, in order; a record without ``episode_id`` is one of its own."""
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
