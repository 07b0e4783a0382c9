"""Convert SWE-bench or NeMo-Gym environment rows into Miles prompt JSONL, streaming and atomically
(memory and shuffle design: docs/data-and-checks.md)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import json
import math
import os
import random
import re
import secrets
import sys
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from miles_nemogym.data._atomic import AtomicFile, AtomicFiles, output_problem
from miles_nemogym.data._environments import (
    EnvironmentInput,
    apportion,
    env_mark_problem,
    environment_of_row,
    is_environment_row,
    parse_env_option,
    task_key,
    to_environment_row,
)
from miles_nemogym.data._rows import (
    Routing,
    checked_swe_prompt_row,
    infer_kind,
    resolve_routing,
    to_prompt_row,
)
from miles_nemogym.data._schema import NEVER_DROPPED, SUBSETS, FieldProblem, Subset, SweBenchInstance, validate_instance
from miles_nemogym.data._select import Selection, instance_ids_option, load_grade_tables, read_instance_ids, split_names
from miles_nemogym.data._sources import RawRow, SourceError, open_file, open_source
from miles_nemogym.episode.record import AGENT_SUFFIX, SWE_ENVIRONMENT
from miles_nemogym.errors import MilesNemoGymError, counted

__all__ = ["ConvertError", "ConvertOptions", "ConvertReport", "RowInvalidError", "convert", "convert_row", "printable"]

MAX_SIZE = 1_000_000
"""The largest ``--size``: memory while mixing grows with it (about 85 bytes a row; measured: bench/README.md)."""
_MAX_LISTED_PROBLEMS = 50
_PROGRESS_EVERY = 200
_DETECT_ROWS = 100
_ITEM_INDEX = re.compile(r"\[\d+\]")
_Progress = Callable[[int, int | None], None]


class ConvertOptions(BaseModel):
    """Everything ``convert`` needs; the CLI flags map one to one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str | None = Field(default=None, min_length=1)
    """SWE-bench rows, or NeMo-Gym environment rows named by their ``agent_ref`` / ``task_source``."""
    output: Path
    environments: tuple[EnvironmentInput, ...] = ()
    """``--env``: NeMo-Gym environment rows per environment, with optional mixing weights."""
    size: int | None = Field(default=None, ge=1)
    """Rows in the mixed output (environment rows with weights); default: the most without repeats."""
    split: str | None = None
    subset: Subset | None = None
    on_error: Literal["fail", "skip"] = "fail"
    gradeable_only: bool = False
    repos: tuple[str, ...] = ()
    exclude_repos: tuple[str, ...] = ()
    instance_ids: Path | tuple[str, ...] | None = None
    """A file of ids (one per line), or the ids themselves."""
    limit: int | None = Field(default=None, ge=1)
    shuffle: bool = False
    seed: int | None = None
    holdout: int = Field(default=0, ge=0)
    holdout_output: Path | None = None
    drop_fields: tuple[str, ...] = ()

    @classmethod
    def from_flags(cls, *, env: Sequence[str] = (), instance_ids: str | None = None, **fields: Any) -> ConvertOptions:
        """The options as the CLI gives them (``ValueError`` naming the fix for bad ``--env``/``--instance-ids``)."""
        environments = tuple(parse_env_option(value, fields.get("input")) for value in env)
        return cls(environments=environments, instance_ids=instance_ids_option(instance_ids), **fields)

    def environment_mode(self) -> bool:
        """NeMo-Gym environment rows: ``--env`` given, or ``--input`` a file whose first row is one."""
        return bool(self.environments) or (self.input is not None and _file_holds_environment_rows(self.input))

    def environment_inputs(self) -> tuple[EnvironmentInput, ...]:
        assert self.input is not None or self.environments
        return self.environments or (EnvironmentInput(None, self.input or ""),)

    @model_validator(mode="after")
    def _consistent(self) -> ConvertOptions:
        if self.input is None and not self.environments:
            raise ValueError("give --input FILE, or --env NAME=FILE[:WEIGHT] for NeMo-Gym environment rows")
        if self.size is not None and self.size > MAX_SIZE:
            raise ValueError(
                f"--size {self.size} is more than {MAX_SIZE}, the most rows a mix writes (each costs about 85 "
                f"bytes of memory while mixing, and its line on disk); give --size {MAX_SIZE} or less, and for more "
                "passes over the rows use Miles' --num-epoch rather than repeating them"
            )
        environment_mode = self.environment_mode()
        if environment_mode:
            self._check_environment_flags()
        elif self.size is not None:
            raise ValueError("--size is for NeMo-Gym environment rows (--env); SWE-bench rows take --limit")
        if self.holdout and self.holdout_output is None:
            raise ValueError("--holdout N needs --holdout-output FILE (where the held-out rows go)")
        if self.holdout_output is not None and not self.holdout:
            raise ValueError("--holdout-output needs --holdout N (how many rows to hold out)")
        if self.seed is not None and not self.shuffle and not environment_mode:
            raise ValueError("--seed only applies with --shuffle; add --shuffle or drop --seed")
        holdouts = [self.holdout_output] if self.holdout_output else []
        if self.holdout_output is not None and _ENV_FIELD in str(self.holdout_output):
            if not environment_mode:
                raise ValueError(f"{_ENV_FIELD} in --holdout-output is for NeMo-Gym environment rows (--env)")
            # One file per environment; those named by their rows are checked when written.
            holdouts = [_holdout_path(self.holdout_output, entry.name) for entry in self.environments if entry.name]
        outputs = [self.output, *holdouts]
        for path in outputs:
            problem = output_problem(path.expanduser())
            if problem:
                raise ValueError(f"{path} {problem}")
        resolved = [path.expanduser().resolve() for path in outputs]
        if len(set(resolved)) != len(resolved):
            raise ValueError("--holdout-output must differ from --output (the two files are disjoint)")
        inputs = {
            f"--env {entry.name}" if entry.name else "--input": Path(entry.source).expanduser()
            for entry in self.environment_inputs()
        }
        if isinstance(self.instance_ids, Path):  # a file of ids (a tuple is ids given inline)
            inputs["--instance-ids"] = self.instance_ids.expanduser()
        for flag, path in inputs.items():
            if any(_same_file(path, output) for output in resolved):
                raise ValueError(
                    f"--output/--holdout-output must differ from {flag} ({path}): it is read, and the "
                    "output replaces its file; choose another output path"
                )
        protected = sorted(split_names(self.drop_fields) & NEVER_DROPPED)
        if protected:
            raise ValueError(
                f"--drop-fields cannot drop {', '.join(protected)}: the server and grader need "
                f"them (required: {', '.join(sorted(NEVER_DROPPED))})"
            )
        both = split_names(self.repos) & split_names(self.exclude_repos)
        if both:
            raise ValueError(f"repos both in --repos and --exclude-repos: {', '.join(sorted(both))}")
        return self

    def _check_environment_flags(self) -> None:
        swe_only = ("subset", "gradeable_only", "repos", "exclude_repos", "instance_ids", "limit", "drop_fields")
        given = ["--" + name.replace("_", "-") for name in swe_only if getattr(self, name)]
        if given:
            raise ValueError(
                f"{', '.join(given)}: SWE-bench flags; NeMo-Gym environment rows take --env, --size, "
                "--holdout, --holdout-output, --shuffle and --seed (--size instead of --limit)"
            )
        names = [entry.name for entry in self.environments]
        repeated = sorted({name for name in names if names.count(name) > 1 and name})
        if repeated:
            raise ValueError(f"--env {', '.join(repeated)} given twice; one file per environment")
        sources = {entry.source for entry in self.environments}
        if sources and self.input is not None and self.input not in sources:
            raise ValueError("--input is not read: every --env names its own file (NAME=FILE); drop --input")
        weighted = [entry.weight is not None for entry in self.environment_inputs()]
        if any(weighted) and not all(weighted):
            raise ValueError("give every --env a weight (NAME=FILE:WEIGHT), or none")
        if self.size is not None and not any(weighted):
            raise ValueError("--size needs a weight on each --env (NAME=FILE:WEIGHT)")


_ENV_FIELD = "{env}"


def _holdout_path(template: Path, environment: str) -> Path:
    """Where ``environment``'s held-out rows go: ``template`` with ``{env}`` replaced by its name."""
    return Path(str(template).replace(_ENV_FIELD, environment))


def _file_holds_environment_rows(spec: str) -> bool:
    """Whether ``spec`` is a local file whose first readable row is a NeMo-Gym environment row."""
    path = Path(spec).expanduser()
    if not path.is_file():
        return False
    try:
        with contextlib.closing(open_file(path).rows) as rows:
            first = next((raw.data for raw in itertools.islice(rows, _DETECT_ROWS) if raw.data is not None), None)
    except (SourceError, OSError):
        return False  # the SWE path reports it
    return first is not None and is_environment_row(first)


def _same_file(path: Path, other: Path) -> bool:
    if path.resolve() == other.resolve():
        return True
    try:
        return os.path.samefile(path, other)  # hard links
    except OSError:  # one of them does not exist yet
        return False


def printable(text: str) -> str:
    """``text`` safe for any terminal: a lone surrogate (JSON allows ``\\udcff``) as its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True)
class RowProblem:
    """A row that was refused: where it is, its instance id if any, and why."""

    where: str
    instance_id: str | None
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        who = f" [{self.instance_id}]" if self.instance_id else ""
        return printable(f"{self.where}{who}: {'; '.join(self.reasons)}")


@dataclass
class ConvertReport:
    """What happened, for the summary and Python callers (``environments``: ``*_by_env`` counts, else ``*_by_repo``)."""

    source: str = ""
    source_kind: str = ""
    subset_rule: str = ""
    rows_read: int = 0
    written: int = 0
    holdout_written: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    written_by_repo: Counter[str] = field(default_factory=Counter)
    holdout_by_repo: Counter[str] = field(default_factory=Counter)
    not_gradeable_by_repo: Counter[str] = field(default_factory=Counter)
    problems: list[RowProblem] = field(default_factory=list)
    problem_count: int = 0
    duplicates: list[RowProblem] = field(default_factory=list)
    overridden_rows: int = 0
    missing_instance_ids: list[str] = field(default_factory=list)
    unmatched_repos: list[str] = field(default_factory=list)
    seed: int | None = None
    stopped_early: bool = False
    swebench_version: str | None = None
    committed: bool = False
    environments: bool = False
    usable_by_env: Counter[str] = field(default_factory=Counter)
    written_by_env: Counter[str] = field(default_factory=Counter)
    repeated_by_env: Counter[str] = field(default_factory=Counter)
    holdout_by_env: Counter[str] = field(default_factory=Counter)
    holdout_files: dict[str, Path] = field(default_factory=dict)

    def notes(self, options: ConvertOptions) -> list[str]:
        """What a reader of the summary should know beyond the counts (the CLI prints each as ``note:``)."""
        return [printable(note) for note in (_environment_notes if self.environments else _swe_notes)(self, options)]


class ConvertError(MilesNemoGymError, RuntimeError):
    """Nothing was written; ``report`` says why (bad rows with ``--on-error fail``, no rows...)."""

    def __init__(self, message: str, report: ConvertReport) -> None:
        super().__init__(message)
        self.report = report


class RowInvalidError(MilesNemoGymError, ValueError):
    """:func:`convert_row` refused a row; ``problems`` lists every broken rule."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        super().__init__("; ".join(str(problem) for problem in problems))
        self.problems = problems


def _swe_notes(report: ConvertReport, options: ConvertOptions) -> list[str]:
    notes = [f"subset: {report.subset_rule}"]
    if report.overridden_rows:
        notes.append(
            f"{counted(report.overridden_rows, 'row')} had {'its' if report.overridden_rows == 1 else 'their'} own "
            "subset/split replaced by the flags"
        )
    if report.not_gradeable_by_repo:
        dropped = ", ".join(f"{repo} ({count})" for repo, count in sorted(report.not_gradeable_by_repo.items()))
        notes.append(f"dropped as not gradeable by swebench {report.swebench_version}: {dropped}")
    if report.seed is not None:
        notes.append(f"shuffled with seed {report.seed}{_repeat(report, options)}")
    if options.holdout and not options.shuffle:
        notes.append("the holdout is the first rows selected; --shuffle makes it a random one")
    if report.stopped_early:
        notes.append("stopped reading once --limit (and --holdout) were filled")
    if report.missing_instance_ids:
        shown = ", ".join(report.missing_instance_ids[:10])
        notes.append(f"{counted(len(report.missing_instance_ids), 'id')} from --instance-ids not in the input: {shown}")
    if report.unmatched_repos:
        notes.append(f"--repos matched no row for: {', '.join(report.unmatched_repos)}")
    return notes


def _repeat(report: ConvertReport, options: ConvertOptions) -> str:
    """How to repeat a run whose seed was drawn; nothing when the user gave ``--seed``."""
    return "" if options.seed is not None else f" (pass --seed {report.seed} to repeat)"


def _environment_notes(report: ConvertReport, options: ConvertOptions) -> list[str]:
    inputs = options.environment_inputs()
    weighted = [entry for entry in inputs if entry.weight is not None]
    notes = []
    if any(entry.name is None for entry in inputs):
        notes.append(f"a row's environment: agent_ref.name (else task_source) less {AGENT_SUFFIX}")
        notes.append("--env NAME=FILE names a file's environment instead")
    if weighted:
        whole = sum(entry.weight or 0 for entry in weighted)
        shares = ", ".join(f"{entry.name} {100 * (entry.weight or 0) / whole:.1f}%" for entry in weighted)
        sizing = f"--size {options.size}" if options.size else "the most rows without repeating one"
        notes.append(f"mixed by weight ({shares}) to {sizing}, in a random order")
    repeated = ", ".join(f"{name} ({count})" for name, count in report.repeated_by_env.items() if count)
    if repeated:
        notes.append(f"rows repeated to fill a share: {repeated}")
        notes.append("a copy's task id ends in #2, #3, ... (a SWE-bench copy: same instance_id)")
    if options.holdout or weighted or options.shuffle:
        notes.append(f"random choices made with seed {report.seed}{_repeat(report, options)}")
    elif len(report.usable_by_env) > 1:
        notes.append("rows are in input order, one environment after another (--shuffle mixes)")
    return notes


def _json_default(value: Any) -> Any:
    # Parquet/Arrow timestamp columns (``created_at`` in some exports) arrive as datetimes.
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def encode_row(row: Mapping[str, Any]) -> bytes:
    """One output line (ASCII-escaped JSON + newline); raises ``ValueError`` for NaN or non-JSON values."""
    try:
        text = json.dumps(row, allow_nan=False, default=_json_default)
    except TypeError as error:
        raise ValueError(str(error)) from None
    return text.encode("ascii") + b"\n"


def _prepare(
    data: Mapping[str, Any], routing: Routing, drop_fields: frozenset[str]
) -> tuple[dict[str, Any], SweBenchInstance, bool] | list[FieldProblem]:
    instance = validate_instance(data)
    mark = env_mark_problem(data, swe_row=True)
    if isinstance(instance, list) or mark:
        return [*(instance if isinstance(instance, list) else []), *([mark] if mark else [])]
    decided = resolve_routing(data, routing)
    if isinstance(decided, list):
        return decided
    subset, split, overrode = decided
    return (to_prompt_row(data, instance, subset=subset, split=split, drop_fields=drop_fields), instance, overrode)


def convert_row(
    row: Mapping[str, Any],
    *,
    environment: str | None = None,
    index: int = 0,
    subset: str | None = None,
    split: str | None = None,
    dataset_name: str = "",
    drop_fields: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One SWE-bench row, or with ``environment`` a NeMo-Gym task row (``index``: its task id if it has no id),
    by the CLI's rules; :class:`RowInvalidError`, a ``ValueError``, names each problem."""
    if environment is not None:
        if subset or split or dataset_name or drop_fields:
            raise ValueError("subset, split, dataset_name and drop_fields are for SWE-bench rows, not environment rows")
        converted = to_environment_row(row, environment, f"{environment}/{task_key(row, index)}")
        if isinstance(converted, FieldProblem):
            raise RowInvalidError([converted])
        return converted
    if subset is not None and subset not in SUBSETS:
        raise RowInvalidError([FieldProblem("subset", "bad_value", f"must be one of {', '.join(SUBSETS)}")])
    protected = set(drop_fields) & NEVER_DROPPED
    if protected:
        raise ValueError(f"cannot drop required fields: {', '.join(sorted(protected))}")
    routing = Routing(subset, split, infer_kind(dataset_name))
    prepared = _prepare(row, routing, frozenset(drop_fields))
    if isinstance(prepared, list):
        raise RowInvalidError(prepared)
    return prepared[0]


class _Spool:
    """Converted lines on disk with their offsets, so ``--shuffle`` never holds rows in memory."""

    def __init__(self, files: AtomicFiles, output: Path) -> None:
        self._writer = files.scratch(output, f"{output} (the rows spooled beside it)")
        self._ends = array("q")
        self._repos: list[str] = []

    def __len__(self) -> int:
        return len(self._ends)

    def add(self, line: bytes, repo: str) -> None:
        self._writer.write(line)
        self._ends.append((self._ends[-1] if self._ends else 0) + len(line))
        self._repos.append(sys.intern(repo))  # one string per repo, not per row

    def lines(self, order: list[int]) -> Iterator[tuple[bytes, str]]:
        """The lines at ``order`` positions, in that order (random reads, page-cache fast)."""
        self._writer.flush()
        with self._writer.temp_path.open("rb") as reader:
            for position in order:
                start = self._ends[position - 1] if position else 0
                reader.seek(start)
                yield reader.read(self._ends[position] - start), self._repos[position]


def _bad_rows(report: ConvertReport) -> ConvertError:
    message = f"{counted(report.problem_count, 'bad row')}; nothing written (--on-error skip writes the good rows)"
    return ConvertError(message, report)


def _record_problem(report: ConvertReport, raw: RawRow, problems: list[str], key: str, who: str | None = None) -> None:
    report.problem_count += 1
    report.skipped[key] += 1
    if len(report.problems) < _MAX_LISTED_PROBLEMS:
        instance_id = raw.data.get("instance_id") if raw.data and who is None else who
        report.problems.append(
            RowProblem(raw.where(), instance_id if isinstance(instance_id, str) else None, tuple(problems))
        )


def _readable(
    source: Iterable[RawRow], report: ConvertReport, progress: _Progress | None, total: int | None
) -> Iterator[tuple[RawRow, Mapping[str, Any]]]:
    """Each row read, counted (``progress`` every few hundred); an unreadable one is recorded, not yielded."""
    for raw in source:
        report.rows_read += 1
        if progress is not None and report.rows_read % _PROGRESS_EVERY == 0:
            progress(report.rows_read, total)
        if raw.data is None:
            _record_problem(report, raw, [raw.error or "unreadable"], "invalid: unreadable row")
        else:
            yield raw, raw.data


def _first(key: str, seen: set[str], reason: str, raw: RawRow, report: ConvertReport) -> bool:
    """Whether ``key`` is seen for the first time (then noted); a repeat is counted and listed."""
    if key not in seen:
        seen.add(key)
        return True
    report.skipped[reason] += 1
    if len(report.duplicates) < _MAX_LISTED_PROBLEMS:
        report.duplicates.append(RowProblem(raw.where(), key, ("kept the first",)))
    return False


def _encoded(row: Mapping[str, Any], raw: RawRow, report: ConvertReport, who: str | None = None) -> bytes | None:
    try:
        return encode_row(row)
    except ValueError as error:
        _record_problem(report, raw, [f"cannot be written as JSON: {error}"], "invalid: not JSON", who)
        return None


def convert(options: ConvertOptions, progress: _Progress | None = None) -> ConvertReport:
    """The report once every output file is in place; else none is touched and it raises ``ConvertError``
    (``report`` says why), another ``MilesNemoGymError`` or ``ValueError``; Ctrl-C while the files are moved
    raises ``InterruptedAfterCommit`` (all were). ``progress(rows_read, total_or_None)`` every few hundred rows."""
    convert_rows = _convert_environments if options.environment_mode() else _convert_swe
    with AtomicFiles() as files:
        report = convert_rows(options, progress, files)
        files.commit()  # the training file, opened first, is moved into place last
        report.committed = True
    return report


def _convert_swe(options: ConvertOptions, progress: _Progress | None, files: AtomicFiles) -> ConvertReport:
    """SWE-bench rows, streamed: checked, routed, selected, written (or spooled to shuffle)."""
    assert options.input is not None
    inferred = infer_kind(options.input)
    split_to_load = options.split or inferred.split or "test"
    routing = Routing(options.subset, options.split, inferred, fallback_split=split_to_load)
    versions_by_repo, parsed_repos, swebench_version = (
        load_grade_tables() if options.gradeable_only else (None, (), None)
    )
    wanted_repos = split_names(options.repos)
    ids = options.instance_ids
    selection = Selection(
        repos=wanted_repos,
        exclude_repos=split_names(options.exclude_repos),
        instance_ids=frozenset(read_instance_ids(ids) if isinstance(ids, Path) else ids) if ids else None,
        versions_by_repo=versions_by_repo,
        parsed_repos=frozenset(parsed_repos),
    )
    drop_fields = split_names(options.drop_fields)
    source = open_source(options.input, split_to_load)
    report = ConvertReport(source=source.name, source_kind=source.kind, swebench_version=swebench_version)
    if options.subset:
        report.subset_rule = f"--subset {options.subset}, for every row"
    elif inferred.subset:
        report.subset_rule = f"each row's own, else '{inferred.subset}' (from the dataset name)"
    else:
        report.subset_rule = "each row's own (--subset sets all; a row without one is refused)"
    if options.shuffle:
        report.seed = options.seed if options.seed is not None else secrets.randbelow(2**31)

    seen_ids: set[str] = set()
    seen_repos: set[str] = set()
    fail = options.on_error == "fail"  # then every row is still checked, to report each bad one
    output = files.open(options.output.expanduser())
    holdout = files.open(options.holdout_output.expanduser()) if options.holdout_output else None
    spool = _Spool(files, options.output.expanduser()) if options.shuffle else None
    for raw, data in _readable(source, report, progress, source.total):
        prepared = _prepare(data, routing, drop_fields)
        if isinstance(prepared, list):
            first = prepared[0]
            _record_problem(report, raw, [str(problem) for problem in prepared], f"invalid: {first.field} {first.rule}")
            continue
        row, instance, overrode = prepared
        if not _first(instance.instance_id, seen_ids, "duplicate instance_id", raw, report):
            continue
        seen_repos.add(instance.repo)
        reason = selection.reason_to_drop(instance)
        if reason is not None:
            report.skipped[reason] += 1
            if reason.startswith("not gradeable"):
                report.not_gradeable_by_repo[instance.repo] += 1
            continue
        line = _encoded(row, raw, report)
        if line is None:
            continue
        report.overridden_rows += overrode
        if fail and report.problem_count:
            continue
        if spool is not None:
            spool.add(line, instance.repo)
            continue
        _write_swe(line, instance.repo, options, report, output, holdout)
        if options.limit is not None and report.written >= options.limit and report.holdout_written >= options.holdout:
            report.stopped_early = True
            break
    if progress is not None:
        progress(report.rows_read, source.total)

    if not report.stopped_early:  # else the rows not read may hold them
        report.missing_instance_ids = sorted((selection.instance_ids or frozenset()) - seen_ids)
        report.unmatched_repos = sorted(wanted_repos - seen_repos)
    if fail and report.problem_count:
        raise _bad_rows(report)
    if spool is not None:
        order = list(range(len(spool)))
        random.Random(report.seed).shuffle(order)
        end = len(order) if options.limit is None else options.holdout + options.limit
        if len(order) > end:
            report.skipped["beyond --limit"] += len(order) - end
        for line, repo in spool.lines(order[:end]):
            _write_swe(line, repo, options, report, output, holdout)
    if options.holdout and report.holdout_written < options.holdout:
        raise ConvertError(
            f"only {counted(report.holdout_written, 'selected row')}, fewer than --holdout {options.holdout}; "
            "nothing written",
            report,
        )
    if report.written == 0:
        raise ConvertError(
            "no rows to write"
            + (" (all selected rows went to the holdout)" if report.holdout_written else "")
            + "; nothing written — see the skip reasons",
            report,
        )
    return report


def _write_swe(
    line: bytes,
    repo: str,
    options: ConvertOptions,
    report: ConvertReport,
    output: AtomicFile,
    holdout: AtomicFile | None,
) -> None:
    """A selected row to the holdout until it holds ``--holdout`` rows, then to the output up to ``--limit``."""
    if holdout is not None and report.holdout_written < options.holdout:
        holdout.write(line)
        report.holdout_written += 1
        report.holdout_by_repo[repo] += 1
    elif options.limit is None or report.written < options.limit:
        output.write(line)
        report.written += 1
        report.written_by_repo[repo] += 1


def _problem_key(problem: FieldProblem) -> str:
    """The skip reason of a refused environment row: its field without item indices, and the rule."""
    return f"invalid: {_ITEM_INDEX.sub('[]', problem.field)} {problem.rule}"


def _copy_line(line: bytes, copy: int) -> bytes:
    """A repeated row's line with ``#<copy>`` appended to its task id (the line's last value)."""
    assert line.endswith(b'"}}\n'), line[-20:]
    return line[:-4] + b"#%d" % copy + line[-4:]


def _convert_environments(options: ConvertOptions, progress: _Progress | None, files: AtomicFiles) -> ConvertReport:
    """NeMo-Gym environment rows: read and check every row, hold out per environment, mix by weight."""
    inputs = options.environment_inputs()
    report = ConvertReport(
        source=", ".join(entry.source for entry in inputs),
        source_kind="NeMo-Gym environment rows",
        environments=True,
        seed=options.seed if options.seed is not None else secrets.randbelow(2**31),
    )
    rng = random.Random(report.seed)
    holdouts: dict[Path, AtomicFile] = {}
    positions: dict[str, list[int]] = {}
    seen: set[str] = set()
    fail = options.on_error == "fail"  # then every row is still checked, to report each bad one
    output = files.open(options.output.expanduser())
    spool = _Spool(files, options.output.expanduser())
    for entry in inputs:
        source = open_source(entry.source, options.split or "train")
        for raw, data in _readable(source, report, progress, None):
            environment = entry.name or environment_of_row(data)
            if isinstance(environment, FieldProblem):
                _record_problem(report, raw, [str(environment)], _problem_key(environment))
                continue
            if environment == SWE_ENVIRONMENT:  # convert's SWE-bench output, mixed in as is
                checked = checked_swe_prompt_row(data)
                task_id = f"{environment}/{checked[0] if isinstance(checked, tuple) else raw.index}"
                row = checked[1] if isinstance(checked, tuple) else checked
            else:
                task_id = f"{environment}/{task_key(data, raw.index)}"
                row = to_environment_row(data, environment, task_id)
            if isinstance(row, FieldProblem):
                _record_problem(report, raw, [str(row)], _problem_key(row), who=task_id)
                continue
            if not _first(task_id, seen, "duplicate task id", raw, report):
                continue
            line = _encoded(row, raw, report, task_id)
            if line is None:
                continue
            if fail and report.problem_count:
                continue
            positions.setdefault(environment, []).append(len(spool))
            spool.add(line, environment)
            report.usable_by_env[environment] += 1
    if progress is not None:
        progress(report.rows_read, report.rows_read)
    if fail and report.problem_count:
        raise _bad_rows(report)
    weights = {entry.name: entry.weight for entry in inputs if entry.name and entry.weight is not None}
    empty = [name for name in weights if name not in positions]
    if empty or not positions:
        raise ConvertError(f"no usable rows{' for ' + ', '.join(empty) if empty else ''}; nothing written", report)

    pools: dict[str, list[int]] = {}
    held: dict[str, list[int]] = {}
    for name, rows in positions.items():
        if options.holdout and len(rows) <= options.holdout:
            raise ConvertError(
                f"{name}: {counted(len(rows), 'usable row')}, not more than --holdout {options.holdout} (each "
                "environment keeps at least one row to train on); nothing written",
                report,
            )
        chosen = set(rng.sample(range(len(rows)), options.holdout)) if options.holdout else set()
        held[name] = [row for index, row in enumerate(rows) if index in chosen]
        pools[name] = [row for index, row in enumerate(rows) if index not in chosen]

    counts = {name: len(pool) for name, pool in pools.items()}
    if weights:
        whole = sum(Fraction(weight) for weight in weights.values())
        total = options.size or min(
            math.floor(len(pools[name]) * whole / Fraction(weight)) for name, weight in weights.items()
        )
        counts = dict(zip(weights, apportion(total, list(weights.values())), strict=True))
    picks: list[tuple[int, int]] = []  # (spool position, copy number)
    for name, count in counts.items():
        pool = pools[name]
        full, part = divmod(count, len(pool))
        for copy in range(1, full + 1):
            picks.extend((row, copy) for row in pool)
        picks.extend((row, full + 1) for row in sorted(rng.sample(pool, part)))
        report.repeated_by_env[name] = max(0, count - len(pool))
    if options.shuffle or weights:
        rng.shuffle(picks)

    for name, rows in held.items():
        if not rows:
            continue
        assert options.holdout_output is not None
        path = _holdout_path(options.holdout_output, name).expanduser()
        if path not in holdouts:  # a path named by the rows: checked as the options check theirs
            taken = [options.output.expanduser(), *holdouts, *(Path(entry.source).expanduser() for entry in inputs)]
            problem = output_problem(path) or (
                "is an input or another output of this conversion; the holdout file would replace it"
                if any(_same_file(path, other) for other in taken)
                else None
            )
            if problem:
                raise ValueError(f"--holdout-output {path} {problem}")
            holdouts[path] = files.open(path)
        for line, _ in spool.lines(rows):
            holdouts[path].write(line)
        report.holdout_by_env[name] = len(rows)
        report.holdout_written += len(rows)
        report.holdout_files[name] = path
    for (line, name), (_, copy) in zip(spool.lines([row for row, _ in picks]), picks, strict=True):
        # A SWE-bench row has no task id to number: its copies are the same instance.
        output.write(line if copy == 1 or name == SWE_ENVIRONMENT else _copy_line(line, copy))
        report.written_by_env[name] += 1
    report.written = len(picks)
    unpicked = sum(max(0, len(pools[name]) - count) for name, count in counts.items())
    if unpicked:
        report.skipped["not picked by the weights"] += unpicked
    if report.written == 0:
        raise ConvertError("no rows to write; nothing written (a larger --size?)", report)
    return report
