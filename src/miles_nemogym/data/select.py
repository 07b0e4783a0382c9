"""Which valid rows go to the output: repo filters, an id list, and ``--gradeable-only``.

The converter's selection flags. Pure: :meth:`Selection.reason_to_drop` decides one
row from its typed instance; :func:`read_instance_ids` is the one helper that reads a file.
``--limit``, ``--shuffle`` and ``--holdout`` act on the stream of selected rows and
live in :mod:`miles_nemogym.data.convert`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from miles_nemogym.data.gradeable import GradeTables
from miles_nemogym.data.schema import SweBenchInstance
from miles_nemogym.errors import MilesNemoGymError


class InstanceIdsError(MilesNemoGymError, ValueError):
    """An ``--instance-ids`` value (list or file) that names no usable id; the message says which."""


_NOT_IN_REPOS = "not in --repos"
_IN_EXCLUDED_REPOS = "in --exclude-repos"
_NOT_IN_INSTANCE_IDS = "not in --instance-ids"
_NOT_GRADEABLE = "not gradeable"


def split_names(values: Iterable[str]) -> frozenset[str]:
    """``["a,b", " c "]`` → ``{"a", "b", "c"}``: flags accept repeats and commas."""
    return frozenset(part.strip() for value in values for part in value.split(",") if part.strip())


def read_instance_ids(path: Path) -> frozenset[str]:
    """The ids in a file: one per line (commas and blanks also separate), ``#`` starts a comment."""
    return frozenset(_file_ids(path))


def parse_instance_ids(value: str) -> list[str]:
    """``--instance-ids`` as every command takes it: a file of ids (as ``read_instance_ids``)
    or a comma-separated list; in the order given, each once. ``ValueError`` when it holds none."""
    path = Path(value).expanduser()
    if path.is_file():
        return _file_ids(path)
    ids = _split_ids(value)
    if not ids:
        raise InstanceIdsError(f"--instance-ids {value!r}: no instance ids given")
    return ids


def instance_ids_option(value: str | None) -> Path | tuple[str, ...] | None:
    """``--instance-ids`` for ``convert``: a file stays a path (so an output onto it is refused),
    a list becomes its ids."""
    if value is None:
        return None
    path = Path(value).expanduser()
    return path if path.is_file() else tuple(parse_instance_ids(value))


def _file_ids(path: Path) -> list[str]:
    ids = _ids_in_file(path)
    if not ids:
        raise InstanceIdsError(f"--instance-ids {path}: holds no instance ids (one per line expected)")
    return ids


def _ids_in_file(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InstanceIdsError(f"--instance-ids {path}: cannot read the file ({error})") from None
    return _split_ids("\n".join(line.split("#", 1)[0] for line in text.splitlines()))


def _split_ids(text: str) -> list[str]:
    return list(dict.fromkeys(item for item in re.split(r"[\s,]+", text) if item))


@dataclass(frozen=True)
class Selection:
    """Row filters; an empty ``repos`` and a ``None`` id set mean "no restriction"."""

    repos: frozenset[str] = frozenset()
    exclude_repos: frozenset[str] = frozenset()
    instance_ids: frozenset[str] | None = None
    grade_tables: GradeTables | None = None

    def reason_to_drop(self, instance: SweBenchInstance) -> str | None:
        """The skip reason for a row, or ``None`` to keep it. Reasons are stable names."""
        if self.repos and instance.repo not in self.repos:
            return _NOT_IN_REPOS
        if instance.repo in self.exclude_repos:
            return _IN_EXCLUDED_REPOS
        if self.instance_ids is not None and instance.instance_id not in self.instance_ids:
            return _NOT_IN_INSTANCE_IDS
        if self.grade_tables is not None:
            why = self.grade_tables.why_not_gradeable(instance.repo, instance.version)
            if why is not None:
                return f"{_NOT_GRADEABLE}: {why}"
        return None
