"""Read the task rows a scan runs: converter output or raw SWE-bench / NeMo-Gym rows.

The agent function sends ``sample.metadata`` — the converter's ``metadata`` object — as
the ``/run`` body; a scan must send the same thing, so each row is turned into that
object here:

- a converter row ``{"prompt": ..., "metadata": {instance_id, ...}}`` → its ``metadata``;
- a raw row with ``instance_id`` at the top level (SWE-bench JSONL/parquet, NeMo-Gym's
  ``example.jsonl``) → the row itself, with ``FAIL_TO_PASS``/``PASS_TO_PASS`` JSON strings
  decoded to lists (as the converter does) and ``subset``/``split`` filled from the
  ``--subset``/``--split`` flags when the row has none. The server reads both fields
  unconditionally (a body without ``subset`` is an HTTP 500 for every episode), so a raw
  row without a subset and without the flag is refused before any episode starts.

The kind is detected per row, so a file mixing both is fine. Every problem is reported
with its line (or row) number and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_nemogym.episode.request import RequestBuildError, build_run_body
from miles_nemogym.errors import MilesNemoGymError

SUBSETS = ("verified", "gym")
_TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")


class InputError(MilesNemoGymError, ValueError):
    """The input file cannot be scanned; the message names the row, the field and the fix."""


@dataclass(frozen=True)
class ScanTask:
    """One instance to scan: the ``metadata`` the agent function would receive for it."""

    instance_id: str
    repo: str
    metadata: dict[str, Any]
    where: str
    """``<file>:<line>`` (or ``<file> row <n>``), for error messages."""


def _rows(path: Path) -> Iterator[tuple[str, Any]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:  # pragma: no cover - the [cli] extra installs pyarrow
            raise InputError(
                f"{path}: reading parquet needs pyarrow; pip install -e '.[cli]' in the miles-nemogym clone"
            ) from None
        try:
            table = pq.read_table(path)
        except Exception as error:  # pyarrow raises many types for a bad file
            raise InputError(f"{path}: not a readable parquet file ({error})") from None
        for number, row in enumerate(table.to_pylist(), start=1):
            yield f"{path} row {number}", row
        return
    try:
        handle = path.open(encoding="utf-8")
    except OSError as error:
        raise InputError(f"{path}: cannot open the input file ({error.strerror})") from None
    with handle:
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    yield where, json.loads(line)
                except json.JSONDecodeError as error:
                    raise InputError(
                        f"{where}: not a JSON object ({error.msg}); the input must be JSON Lines "
                        "(one task row per line) or .parquet"
                    ) from None
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text; the input must be JSON Lines or .parquet") from None


def _task_metadata(row: Any, where: str) -> dict[str, Any]:
    """The agent-side ``metadata`` of one row, whichever of the two shapes it has."""
    if not isinstance(row, Mapping):
        raise InputError(f"{where}: expected a JSON object, got {type(row).__name__}")
    inner = row.get("metadata")
    if "instance_id" not in row and isinstance(inner, Mapping) and "instance_id" in inner:
        return dict(inner)  # converter output: {"prompt", "metadata"}
    if "instance_id" in row:
        return dict(row)  # raw SWE-bench / NeMo-Gym row
    raise InputError(
        f"{where}: no 'instance_id' at the top level or in 'metadata'; expected a converter row "
        '{"prompt": ..., "metadata": {"instance_id": ...}} or a raw SWE-bench row'
    )


def _normalise(metadata: dict[str, Any], where: str, subset: str | None, split: str | None) -> None:
    for name in _TEST_LISTS:
        value = metadata.get(name)
        if isinstance(value, str):
            try:
                metadata[name] = json.loads(value)
            except json.JSONDecodeError:
                raise InputError(f"{where}: {name} is a string but not a JSON list of test names") from None
        if name in metadata and not (
            isinstance(metadata[name], list) and all(isinstance(item, str) for item in metadata[name])
        ):
            raise InputError(f"{where}: {name} must be a list of test names (or its JSON encoding)")
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
    path: Path,
    *,
    subset: str | None = None,
    split: str | None = None,
    golden: bool = False,
) -> list[ScanTask]:
    """Every task row of ``path``, each already checked against the request builder.

    Raises ``InputError`` for the first bad row, an empty file or a repeated instance id.
    """
    if subset is not None and subset not in SUBSETS:
        raise InputError(f"--subset {subset!r}: expected one of {', '.join(SUBSETS)}")
    if not path.exists():
        raise InputError(f"{path}: no such input file")
    tasks: list[ScanTask] = []
    seen: dict[str, str] = {}
    for where, row in _rows(path):
        metadata = _task_metadata(row, where)
        instance_id = metadata.get("instance_id")
        if not isinstance(instance_id, str) or not instance_id:
            raise InputError(f"{where}: instance_id must be a non-empty string, got {instance_id!r}")
        if instance_id in seen:
            raise InputError(
                f"{where}: instance {instance_id} repeats {seen[instance_id]}; each instance must appear "
                "once (results and --resume are keyed by instance_id)"
            )
        seen[instance_id] = where
        _normalise(metadata, where, subset, split)
        if golden and not (isinstance(metadata.get("patch"), str) and metadata["patch"].strip()):
            raise InputError(
                f"{where}: instance {instance_id} has no gold 'patch'; a golden scan applies it, so "
                "every row needs the SWE-bench 'patch' field"
            )
        try:
            # The same check the agent function runs: a row that cannot form a body fails
            # here, before any episode starts, instead of as a masked episode later.
            build_run_body(metadata, None, policy_base_url=None)
        except RequestBuildError as error:
            raise InputError(f"{where}: instance {instance_id}: {error}") from None
        tasks.append(ScanTask(instance_id, _repo_of(metadata, instance_id), metadata, where))
    if not tasks:
        raise InputError(f"{path}: the input file holds no task rows")
    return tasks
