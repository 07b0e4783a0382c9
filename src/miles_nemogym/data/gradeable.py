"""Can the installed ``swebench`` package grade a task row? (``--gradeable-only``)

Why (docs/upstream.md, NeMo-Gym): the server grades every episode with
``swebench.harness.test_spec.test_spec.make_test_spec`` and then
``swebench.harness.grading.get_eval_report``. Those index three tables by the row's
``repo`` (and ``version``): ``MAP_REPO_VERSION_TO_SPECS[repo][version]``,
``MAP_REPO_TO_EXT[repo]`` and ``MAP_REPO_TO_PARSER[repo]``. A row missing from any of
them raises ``KeyError`` at grading time and scores 0 after a full, paid episode (the
known SWE-Gym limitation, e.g. ``getmoto/moto`` with swebench 4.1.0).

We look the keys up instead of calling ``make_test_spec``: for Python repos that
function downloads ``requirements.txt``/``environment.yml`` from GitHub, which would
make the filter need the network and take seconds per row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.pins import SWEBENCH_VERSION

INSTALL_COMMAND = f"pip install 'swebench=={SWEBENCH_VERSION}'"


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
            f"install it with: {INSTALL_COMMAND}"
        ) from None
    specs: Mapping[str, Mapping[Any, Any]] = MAP_REPO_VERSION_TO_SPECS
    return GradeTables(
        versions_by_repo={repo: frozenset(map(str, table)) for repo, table in specs.items()},
        repos_with_ext=frozenset(MAP_REPO_TO_EXT),
        repos_with_parser=frozenset(MAP_REPO_TO_PARSER),
        swebench_version=str(getattr(swebench, "__version__", "unknown")),
    )
