"""Read a scan's task rows: converter output, raw SWE-bench rows, or ``convert --env``'s environment rows."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_nemogym.data import SUBSETS, decode_test_lists, named_environment, open_file
from miles_nemogym.episode.record import ENV_KEY, SWE_ENVIRONMENT, TASK_ID_KEY
from miles_nemogym.errors import MilesNemoGymError

__all__ = ["InputError", "ScanTask", "load_tasks", "select"]


class InputError(MilesNemoGymError, ValueError):
    """The input file cannot be scanned; the message names the row, the field and the fix."""


@dataclass(frozen=True)
class ScanTask:
    """One instance to scan: the ``metadata`` the agent function would receive for it."""

    instance_id: str  # the SWE-bench instance id, or an environment row's nemogym_task_id
    repo: str
    metadata: dict[str, Any]
    where: str  # ``<file>:<line>`` (or ``<file> row <n>``), for error messages
    environment: str = SWE_ENVIRONMENT  # or the NEMO_GYM_ENVS name of an environment row's environment


def _rows(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for each row, read by :func:`data.open_file`."""
    try:
        for raw in open_file(path):
            where = raw.location(str(path))
            if raw.error is not None:
                raise InputError(
                    f"{where}: {raw.error}; the input must be JSON Lines (one task row per line), JSON or .parquet"
                )
            yield where, raw.data
    except InputError:
        raise
    except MilesNemoGymError as error:  # the file cannot be read (past some row)
        raise InputError(str(error)) from None
    except OSError as error:
        raise InputError(f"{path}: cannot open the input file ({error.strerror or error})") from None


def _task_metadata(row: Any, where: str) -> tuple[str, dict[str, Any]]:
    """(the row's environment, its agent-side ``metadata``), whichever shape the row has."""
    if not isinstance(row, Mapping):
        raise InputError(f"{where}: expected a JSON object, got {type(row).__name__}")
    inner = row.get("metadata")
    environment = _environment_of(row)
    if environment is not None:
        metadata = inner if isinstance(inner, Mapping) and inner.get(ENV_KEY) == environment else None
        if metadata is None:
            named = environment if environment != "an environment" else "NAME"
            raise InputError(
                f"{where}: a raw NeMo-Gym task row of environment {environment}; scan reads environment rows "
                f"as `miles-nemogym convert --env {named}=FILE -o rows.jsonl` writes them (the prompt, the "
                "environment and a task id per row): convert the file, then scan its output"
            )
        return environment, dict(metadata)
    if "instance_id" not in row and isinstance(inner, Mapping) and "instance_id" in inner:
        return SWE_ENVIRONMENT, dict(inner)  # converter output: {"prompt", "metadata"}
    if "instance_id" in row:
        return SWE_ENVIRONMENT, dict(row)  # raw SWE-bench / NeMo-Gym row
    raise InputError(
        f"{where}: no 'instance_id' at the top level or in 'metadata'; expected a converter row "
        '{"prompt": ..., "metadata": {"instance_id": ...}}, a raw SWE-bench row, or an environment row '
        "as `miles-nemogym convert --env NAME=FILE` writes it"
    )


def _environment_of(row: Mapping[str, Any]) -> str | None:
    """A non-SWE row's environment (``convert --env``'s mark, or a raw NeMo-Gym row's: ``"an environment"`` unnamed)."""
    inner = row.get("metadata")
    for shape in (row, inner if isinstance(inner, Mapping) else {}):
        mark = shape.get(ENV_KEY)
        if isinstance(mark, str) and mark and mark != SWE_ENVIRONMENT:
            return mark
    return named_environment(row)


def _normalise(metadata: dict[str, Any], where: str, subset: str | None, split: str | None) -> None:
    try:
        decode_test_lists(metadata)
    except ValueError as error:
        raise InputError(f"{where}: {error}") from None
    if not metadata.get("subset"):
        if subset is None:
            raise InputError(
                f"{where}: the row has no 'subset' (the server picks the task image by it and fails "
                "every episode without one); pass --subset verified (SWE-bench images) or "
                "--subset gym (SWE-Gym images), or convert the data with `miles-nemogym convert`"
            )
        metadata["subset"] = subset
    if not metadata.get("split"):
        metadata["split"] = split or "test"


def _repo_of(metadata: Mapping[str, Any], instance_id: str) -> str:
    repo = metadata.get("repo")
    if isinstance(repo, str) and repo:
        return repo
    # SWE-bench ids are "<owner>__<name>-<number>".
    owner, sep, rest = instance_id.partition("__")
    return f"{owner}/{rest.rsplit('-', 1)[0]}" if sep else "?"


def load_tasks(
    path: Path, *, subset: str | None = None, split: str | None = None, golden: bool = False
) -> list[ScanTask]:
    """Every task row of ``path`` (its ``/run`` body is built and checked by the scan before any episode)."""
    if subset is not None and subset not in SUBSETS:
        raise InputError(f"--subset {subset!r}: expected one of {', '.join(SUBSETS)}")
    if not path.exists():
        raise InputError(f"{path}: no such input file")
    tasks: list[ScanTask] = []
    seen: dict[str, str] = {}
    for where, row in _rows(path):
        environment, metadata = _task_metadata(row, where)
        swe = environment == SWE_ENVIRONMENT
        if tasks and swe != (tasks[0].environment == SWE_ENVIRONMENT):
            raise InputError(
                f"{where}: a {'SWE-bench' if swe else f'{environment} environment'} row after "
                f"{'SWE-bench' if tasks[0].environment == SWE_ENVIRONMENT else 'environment'} rows "
                f"({tasks[0].where}); a scan reads one kind (SWE rows run on NEMO_GYM_URL, environment rows "
                "on NEMO_GYM_ENVS): scan them as two files, e.g. `miles-nemogym convert` each kind apart"
            )
        key = "instance_id" if swe else TASK_ID_KEY
        instance_id = metadata.get(key)
        if not isinstance(instance_id, str) or not instance_id:
            raise InputError(f"{where}: {key} must be a non-empty string, got {instance_id!r}")
        if instance_id in seen:
            raise InputError(
                f"{where}: {'instance' if swe else 'task'} {instance_id} repeats {seen[instance_id]}; each must "
                f"appear once (results and --resume are keyed by {key})"
            )
        seen[instance_id] = where
        if not swe:
            tasks.append(ScanTask(instance_id, "", metadata, where, environment))
            continue
        _normalise(metadata, where, subset, split)
        if golden and not (isinstance(metadata.get("patch"), str) and metadata["patch"].strip()):
            raise InputError(
                f"{where}: instance {instance_id} has no gold 'patch'; a golden scan applies it, so "
                "every row needs the SWE-bench 'patch' field"
            )
        tasks.append(ScanTask(instance_id, _repo_of(metadata, instance_id), metadata, where))
    if not tasks:
        raise InputError(f"{path}: the input file holds no task rows")
    return tasks


def select(tasks: list[ScanTask], instance_ids: list[str] | None, limit: int | None) -> list[ScanTask]:
    """The tasks to scan, in input order; an unknown id is an error (a typo must not shrink the scan)."""
    if instance_ids is not None:
        known = {task.instance_id for task in tasks}
        missing = [item for item in instance_ids if item not in known]
        if missing:
            shown = ", ".join(missing[:10]) + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else "")
            raise InputError(f"--instance-ids: not in the input file: {shown}")
        wanted = set(instance_ids)
        tasks = [task for task in tasks if task.instance_id in wanted]
    return tasks[:limit]  # ScanConfig checks limit >= 1
