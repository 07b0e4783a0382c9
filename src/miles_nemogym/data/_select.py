"""Which valid SWE-bench rows go to the output: ``--repos``, ``--exclude-repos``, ``--instance-ids``
and ``--gradeable-only`` (``--limit``, ``--shuffle`` and ``--holdout`` act later, in ``convert``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_nemogym.data._schema import SweBenchInstance
from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.pins import SWEBENCH_VERSION

__all__ = ["SwebenchMissingError", "instance_ids_option", "parse_instance_ids"]


class InstanceIdsError(MilesNemoGymError, ValueError):
    """An ``--instance-ids`` value (list or file) that names no usable id; the message says which."""


class SwebenchMissingError(MilesNemoGymError, RuntimeError):
    """``--gradeable-only`` was asked for but ``swebench`` is not importable."""


def split_names(values: Iterable[str]) -> frozenset[str]:
    """``["a,b", " c "]`` → ``{"a", "b", "c"}``: flags accept repeats and commas."""
    return frozenset(part.strip() for value in values for part in value.split(",") if part.strip())


def read_instance_ids(path: Path) -> list[str]:
    """The ids in a file, in order, each once: one per line (or comma/blank separated), ``#`` a comment."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InstanceIdsError(f"--instance-ids {path}: cannot read the file ({error})") from None
    ids = _split_ids("\n".join(line.split("#", 1)[0] for line in text.splitlines()))
    if not ids:
        raise InstanceIdsError(f"--instance-ids {path}: holds no instance ids (one per line expected)")
    return ids


def parse_instance_ids(value: str) -> list[str]:
    """``--instance-ids`` as every command takes it: a file of ids or a comma-separated list."""
    path = Path(value).expanduser()
    if path.is_file():
        return read_instance_ids(path)
    ids = _split_ids(value)
    if not ids:
        raise InstanceIdsError(f"--instance-ids {value!r}: no instance ids given")
    return ids


def instance_ids_option(value: str | None) -> Path | tuple[str, ...] | None:
    """``--instance-ids`` for ``convert``: a file stays a path (so an output onto it is refused)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    return path if path.is_file() else tuple(parse_instance_ids(value))


def _split_ids(text: str) -> list[str]:
    return list(dict.fromkeys(item for item in re.split(r"[\s,]+", text) if item))


def load_grade_tables() -> tuple[dict[str, frozenset[str]], frozenset[str], str]:
    """The installed ``swebench``'s versions by repo, the repos it can parse a log of, and its version (the
    lookups the grader performs: docs/data-and-checks.md); raises :class:`SwebenchMissingError`."""
    try:
        import swebench
        from swebench.harness.constants import MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS
        from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    except ImportError as error:
        raise SwebenchMissingError(
            f"--gradeable-only needs the swebench package the server grades with ({error}); "
            f"install it with: pip install 'swebench=={SWEBENCH_VERSION}'"
        ) from None
    specs: Mapping[str, Mapping[Any, Any]] = MAP_REPO_VERSION_TO_SPECS
    return (
        {repo: frozenset(map(str, table)) for repo, table in specs.items()},
        frozenset(MAP_REPO_TO_EXT) & frozenset(MAP_REPO_TO_PARSER),
        str(getattr(swebench, "__version__", "unknown")),
    )


@dataclass(frozen=True)
class Selection:
    """Row filters; an empty ``repos`` and a ``None`` id set or version table mean "no restriction"."""

    repos: frozenset[str] = frozenset()
    exclude_repos: frozenset[str] = frozenset()
    instance_ids: frozenset[str] | None = None
    versions_by_repo: Mapping[str, frozenset[str]] | None = None  # --gradeable-only: swebench's tables
    parsed_repos: frozenset[str] = frozenset()

    def reason_to_drop(self, instance: SweBenchInstance) -> str | None:
        """The skip reason for a row (a stable name), or ``None`` to keep it."""
        if self.repos and instance.repo not in self.repos:
            return "not in --repos"
        if instance.repo in self.exclude_repos:
            return "in --exclude-repos"
        if self.instance_ids is not None and instance.instance_id not in self.instance_ids:
            return "not in --instance-ids"
        if self.versions_by_repo is None:
            return None
        versions = self.versions_by_repo.get(instance.repo)
        if versions is None:
            return "not gradeable: repo unknown to swebench"
        if instance.version not in versions:
            return "not gradeable: version unknown to swebench"
        if instance.repo not in self.parsed_repos:
            return "not gradeable: no swebench log parser"
        return None
