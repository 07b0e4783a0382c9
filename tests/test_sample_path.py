"""docs/architecture.md's "One sample's path, measured" states what the code runs today.

The tracer and both sample drivers (tests/support/sample_path.py, behind
``scripts/sample_path.py``) run here over loopback servers, each sample in a fresh
interpreter; the doc's two tables are parsed and compared cell by cell with the same
tables built from the measurement, so a change to the path fails here until the doc is
updated (``python scripts/sample_path.py`` prints the tables to paste). The redesign's
goal (at most 12 files a sample, no module pair calling both ways) is not asserted.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.sample_path import (
    LABELS,
    SAMPLES,
    PathMeasurement,
    Tracer,
    files_table,
    measure_all_fresh,
    summary_table,
)

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def QUALIFIED(name: str) -> str:
    """A function's name as the tracer reports it: qualified from Python 3.11 (``co_qualname``), plain before."""
    return name if sys.version_info >= (3, 11) else name.rpartition(".")[2]


SECTION = "## One sample's path, measured"
CONTRACT = "routing_root/responses_api_models/miles_routing_model/routing_contract"
_ALL_FUNCTIONS = re.compile(r"functions \(all, Python (\d+\.\d+)\)")

Table = dict[str, dict[str, str]]


@pytest.fixture(scope="module")
def measured() -> list[PathMeasurement]:
    return measure_all_fresh(SAMPLES)


def section(text: str) -> str:
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end != -1 else len(text)]


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table in ``text``: its rows (header first, the --- row left out) as cells."""
    found: list[list[list[str]]] = []
    previous = False
    for line in text.splitlines():
        is_row = line.startswith("|")
        if is_row:
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(set(cell) <= {"-", ":"} for cell in cells):
                if not previous:
                    found.append([])
                found[-1].append(cells)
        previous = is_row
    return found


def keyed(rows: list[list[str]]) -> Table:
    """A table as {first cell: {column header: cell}}."""
    header, *body = rows
    return {row[0]: dict(zip(header[1:], row[1:], strict=True)) for row in body}


def table_starting(text: str, first_header: str) -> list[list[str]]:
    matching = [table for table in tables(text) if table[0][0].startswith(first_header)]
    assert len(matching) == 1, (
        f"docs/architecture.md's {SECTION!r} needs one table whose header starts {first_header!r}"
    )
    return matching[0]


def differences(doc: Table, now: Table) -> list[str]:
    problems = []
    for row in sorted(set(doc) | set(now)):
        if row not in now:
            problems.append(f"row {row!r}: in the doc, not measured")
        elif row not in doc:
            problems.append(f"row {row!r}: measured {now[row]}, missing from the doc")
        else:
            for column in now[row]:
                if doc[row].get(column) != now[row][column]:
                    problems.append(
                        f"{row} / {column}: doc says {doc[row].get(column)!r}, measured {now[row][column]!r}"
                    )
    return problems


def python_neutral(rows: list[list[str]]) -> tuple[str, list[list[str]]]:
    """(the Python version the 'functions (all, ...)' column was measured on, the rows with that
    header cell made version-free): comprehensions are frames of their own only before 3.12."""
    header = rows[0]
    column = next(i for i, cell in enumerate(header) if _ALL_FUNCTIONS.fullmatch(cell))
    version = _ALL_FUNCTIONS.fullmatch(header[column])
    assert version is not None
    return version.group(1), [[*header[:column], "functions (all)", *header[column + 1 :]], *rows[1:]]


def test_the_docs_measured_path_tables_match_todays_code(measured: list[PathMeasurement]) -> None:
    if any(m.salvage == "ran" for m in measured):
        pytest.skip("Miles imports here: the doc's figures are measured without Miles' salvage step")
    doc = section(DOC.read_text(encoding="utf-8"))
    rerun = "\nre-run `python scripts/sample_path.py` and paste its two tables into docs/architecture.md"

    doc_python, doc_summary = python_neutral(table_starting(doc, "sample"))
    now_python, now_summary = python_neutral(tables(summary_table(measured))[0])
    doc_rows, now_rows = keyed(doc_summary), keyed(now_summary)
    if doc_python != now_python:  # every other figure is the same on every Python we support
        for rows in (doc_rows, now_rows):
            for cells in rows.values():
                cells.pop("functions (all)")
    problems = differences(doc_rows, now_rows)
    problems += differences(keyed(table_starting(doc, "file")), keyed(tables(files_table(measured))[0]))
    assert not problems, "\n".join(problems) + rerun

    for m in measured:  # the prose names the pairs the table counts
        for a, b in m.both_ways:
            assert f"`{a}` ⇄ `{b}`" in doc, f"the doc does not list `{a}` ⇄ `{b}`{rerun}"


def test_each_sample_runs_its_own_path_through_the_hooks(measured: list[PathMeasurement]) -> None:
    by_sample = {m.sample: m for m in measured}
    swe, environment, failing, agent_row, buffered = (by_sample[name] for name in SAMPLES)
    hooks = {"agent.py", "groups.py", "metrics.py", "store/__init__.py"}
    for m in measured:
        assert hooks <= set(m.files), (m.sample, m.files)
        named = {(f.file, f.name) for f in m.functions}
        assert ("store/__init__.py", QUALIFIED("EpisodeStore._write")) in named  # the writer thread is traced
        assert not any(f.name.endswith("<module>") for f in m.functions)  # imports happen before tracing
    # Each kind is prepared by the agent function and attempted by the one delivery (``runtime.deliver``).
    assert ("agent", "episode/run") in swe.edges
    assert ("agent", "episode/environment") in environment.edges
    for m, kind in ((swe, "episode/run.py"), (environment, "episode/environment.py")):
        attempted_by = {
            (caller.file, caller.name)
            for caller, callee in m.calls
            if (callee.file, callee.name.rpartition(".")[2]) == (kind, "attempt")
        }
        assert attempted_by == {("runtime.py", "_tries")}, (m.sample, attempted_by)
    assert "episode/environment.py" not in swe.files and "episode/run.py" not in environment.files
    for m in (swe, environment, agent_row, buffered):  # a chain starts where Miles calls: at a hook
        assert f"{m.longest_chain[0]}.py" in hooks | {"buffer.py"}, m.longest_chain
    for m in measured:  # the same transport and delivery for every kind
        assert {"transport.py", "runtime.py", "episode/record.py"} <= set(m.files), m.files
        assert {("runtime.py", "deliver"), ("runtime.py", QUALIFIED("InFlight.run"))} <= {
            (f.file, f.name) for f in m.functions
        }
    assert set(LABELS) == {m.sample for m in measured}
    # A failed SWE episode's reason is redacted before it is recorded; an agent row's policy URL
    # goes out as a rollout id; the fully async buffer judges the group with the filter's rules.
    assert ("episode/record", "errors") in failing.edges and "errors.py" not in swe.files
    assert ("errors.py", "redact_urls") in {(f.file, f.name) for f in failing.functions}
    assert ("episode/run", f"{CONTRACT}") in agent_row.edges
    assert ("buffer", "groups") in buffered.edges and "buffer.py" not in swe.files


def test_one_samples_path_stays_short_and_never_runs_back(measured: list[PathMeasurement]) -> None:
    """The design's goal (docs/architecture.md): at most 12 files per sample, and no two modules
    calling each other (so the path reads top to bottom)."""
    for m in measured:
        assert len(m.files) <= 12, (m.sample, m.files)
        assert m.both_ways == [], (m.sample, m.both_ways)


def test_the_tracer_counts_functions_edges_pairs_both_ways_and_the_longest_chain(tmp_path: Path) -> None:
    package = tmp_path / "pkg_traced"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text(
        textwrap.dedent(
            """
            from pkg_traced.sub import b


            def start():
                return b.middle(lambda: [x for x in range(2)])


            def back():
                return end()


            def end():
                return 1
            """
        )
    )
    (package / "sub" / "b.py").write_text(
        textwrap.dedent(
            """
            def middle(callback):
                from pkg_traced import a

                callback()
                return a.back()


            def unused():
                return 0
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    try:
        from pkg_traced import a  # type: ignore[import-not-found]

        tracer = Tracer(package)
        with tracer.tracing():
            a.start()
        tracer.active = False
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.startswith("pkg_traced")]:
            del sys.modules[name]
    m = tracer.measurement("swe", "ran")
    assert m.files == ["a.py", "sub/b.py"]
    names = {f.name for f in m.functions}
    assert {"start", "back", "end", "middle", QUALIFIED("start.<locals>.<lambda>")} <= names and "unused" not in names
    assert m.named_functions == 4 and len(m.functions) == m.named_functions + len(
        names - {"start", "back", "end", "middle"}
    )
    assert m.edges == [("a", "sub/b"), ("sub/b", "a")]
    assert m.both_ways == [("a", "sub/b")]
    assert sorted(m.calls_between("sub/b", "a")) == sorted(
        ["middle -> back", f"middle -> {QUALIFIED('start.<locals>.<lambda>')}"]
    )
    assert m.longest_chain == ["a", "sub/b", "a"]
