"""The repository explains itself: its documents point at files and tests that exist, and
nothing points outside it (to notes that are not in the repository, or to issue numbers)."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path

from miles_nemogym.settings import ENV_VARS, Settings

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "miles_nemogym"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# Every document a reader is sent to: README's links lead to each of these.
DOCUMENTS = [ROOT / "README.md", *DOCS, ROOT / "bench" / "README.md", ROOT / "examples" / "swebench_grpo" / "README.md"]


def _test_functions() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        names.update(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


def test_every_test_upstream_md_names_as_proof_exists() -> None:
    defined = _test_functions()
    rows = [line for line in (ROOT / "docs" / "upstream.md").read_text().splitlines() if line.startswith("| ")]
    proofs = [cell for row in rows for cell in [row.rstrip(" |").rsplit(" | ", 1)[-1]]]
    named = {name for cell in proofs for name in re.findall(r"\b(test_\w+)\b(?!\.py|/)", cell)}
    assert len(named) >= 20  # the tables are read: each behaviour row names its test
    assert sorted(named - defined) == []
    files = {path for cell in proofs for path in re.findall(r"(tests/[\w/]+\.py)", cell)}
    assert sorted(path for path in files if not (ROOT / path).is_file()) == []


def test_every_file_the_documents_point_to_exists() -> None:
    missing = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        # examples/ paths that are not ours are Miles' (e.g. its examples/experimental/ folder).
        ours = r"(?:tests|docs|bench|scripts|src|examples/swebench_grpo)/"
        for path in re.findall(r"(?<![\w/.])(" + ours + r"[\w/.-]+\.(?:py|md))", text):
            if not (ROOT / path).is_file():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
        for link in re.findall(r"\]\((?!https?:)([^)#]+)", text):
            if not (doc.parent / link).exists():
                missing.append(f"{doc.relative_to(ROOT)}: ({link})")
    assert missing == []


def test_the_architecture_module_map_names_modules_that_exist() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    modules = set(re.findall(r"`((?:[a-z_]+/)?[a-z_]+\.py)`", text))
    assert len(modules) >= 40
    assert sorted(m for m in modules if not (PACKAGE / m).is_file() and not (ROOT / m).is_file()) == []
    in_picture = set(re.findall(r"\s((?:[a-z_]+/)?[a-z_]+\.py)\b", text.split("## Module map")[0]))
    assert sorted(m for m in in_picture if not (PACKAGE / m).is_file()) == []
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert sorted(p for p in packages if f"`{p}/`" not in text) == []  # every sub-package is on the map


def test_nothing_points_outside_the_repository() -> None:
    outside = re.compile(
        "|".join(
            ["CONTRACTS" + r"\.md", "GYM_ON" + "_CPU", "MILES_ON" + "_CPU", r"\.\./shared", r"\bissue" + r" #?\d+"]
        ),
        re.I,
    )
    found = []
    for folder in ("src", "tests", "docs", "bench", "scripts", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".md", ".yaml", ".toml"} and path.is_file():
                for number, line in enumerate(path.read_text().splitlines(), 1):
                    if outside.search(line):
                        found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    for path in (ROOT / "README.md", ROOT / "pyproject.toml", ROOT / ".ci" / "run"):
        found += [
            f"{path.name}: {line.strip()[:100]}" for line in path.read_text().splitlines() if outside.search(line)
        ]
    assert found == []


def test_the_readme_is_short_and_links_every_document() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300  # a newcomer reads it to the end; the rest lives in docs/
    linked = {(ROOT / link).resolve() for link in re.findall(r"\]\((?!https?:)([^)#]+)", readme)}
    assert sorted(str(doc.relative_to(ROOT)) for doc in DOCUMENTS[1:] if doc.resolve() not in linked) == []


NOT_SETTINGS = {"MILES_NEMOGYM_GYM_PYTHON", "MILES_NEMOGYM_CACHE", "MILES_SRC", "MEGATRON_SRC"}
"""Variables README's settings table documents that ``Settings`` does not read (serve, smoke, the tests)."""


def _settings_table() -> dict[str, tuple[str, str]]:
    """README's settings table: variable -> (its default cell, its meaning cell)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\| `([A-Z_]+)` \| (.*?) \| (.*) \|$", line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} has two rows"
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, Enum):
        return f"`{default.value}`"
    if isinstance(default, float):
        return f"`{default:g}`"
    return f"`{default}`"


def test_the_readme_settings_table_lists_every_variable_with_its_default() -> None:
    rows = _settings_table()
    assert sorted(rows) == sorted({*ENV_VARS, *NOT_SETTINGS})
    wrong = []
    for field in Settings.model_fields.values():
        assert field.alias is not None
        default_cell, _ = rows[field.alias]
        if not default_cell.startswith(_shown(field.default)):
            wrong.append(f"{field.alias}: README says {default_cell!r}, Settings' default is {field.default!r}")
    assert wrong == []


def test_the_settings_table_is_in_the_readme_only() -> None:
    twice = [
        str(doc.relative_to(ROOT))
        for doc in DOCUMENTS[1:]
        if sum(f"| `{name}` |" in doc.read_text() for name in ENV_VARS) > len(ENV_VARS) // 2
    ]
    assert twice == []


def test_both_readmes_agree_that_miles_parse_args_accepting_the_command_is_verified() -> None:
    """README says the CPU test verifies it; the example's GPU to-do list must not ask for it again."""
    test = "tests/integration/test_miles_parses_launcher_command.py"
    assert (ROOT / test).is_file()
    example = (ROOT / "examples" / "swebench_grpo" / "README.md").read_text(encoding="utf-8")
    still = " ".join(example.split("Still to verify on a GPU node:", 1)[1].split("\n\n", 2)[1].split())
    assert test in (ROOT / "README.md").read_text(encoding="utf-8")
    assert test in still and "only the GPU run is unverified" in still
    assert "accepts the whole command (" not in still
