"""Can the installed ``swebench`` grade a task row? (``--gradeable-only``)

Looks up the repo/version tables the grader indexes instead of calling ``make_test_spec``
(which needs the network); why: docs/data-and-checks.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.pins import SWEBENCH_VERSION

_INSTALL_COMMAND = f"pip install 'swebench=={SWEBENCH_VERSION}'"


class SwebenchMissingError(MilesNemoGymError, RuntimeError):
    """``--gradeable-only`` was asked for but ``swebench`` is not importable."""


@dataclass(frozen=True)
class GradeTables:
    """The three ``swebench`` lookups the grader performs, as plain key sets."""

    versions_by_repo: Mapping[str, frozenset[str]]
    repos_with_ext: frozenset[str]
    repos_with_parser: frozenset[str]
    swebench_version: str

    def why_not_gradeable(self, repo: str, version: str) -> str | None:
        """``None`` when gradeable, else a short reason naming the missing table entry."""
        versions = self.versions_by_repo.get(repo)
        if versions is None:
            return "repo unknown to swebench"
        if version not in versions:
            return "version unknown to swebench"
        if repo not in self.repos_with_ext or repo not in self.repos_with_parser:
            return "no swebench log parser"
        return None


def load_grade_tables() -> GradeTables:
    """Read the tables from the installed ``swebench``; raises :class:`SwebenchMissingError`."""
    try:
        import swebench
        from swebench.harness.constants import MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS
        from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    except ImportError as error:
        raise SwebenchMissingError(
            f"--gradeable-only needs the swebench package the server grades with ({error}); "
            f"install it with: {_INSTALL_COMMAND}"
        ) from None
    specs: Mapping[str, Mapping[Any, Any]] = MAP_REPO_VERSION_TO_SPECS
    return GradeTables(
        versions_by_repo={repo: frozenset(map(str, table)) for repo, table in specs.items()},
        repos_with_ext=frozenset(MAP_REPO_TO_EXT),
        repos_with_parser=frozenset(MAP_REPO_TO_PARSER),
        swebench_version=str(getattr(swebench, "__version__", "unknown")),
    )
