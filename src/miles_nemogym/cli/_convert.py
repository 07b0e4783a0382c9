"""``miles-nemogym convert``: SWE-bench-family dataset → Miles prompt JSONL."""

from __future__ import annotations

import contextlib
import functools
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from miles_nemogym.cli._console import fail, interrupt_on_signals
from miles_nemogym.cli._options import InstanceIds, choice, metavar, subset_option

if TYPE_CHECKING:
    from miles_nemogym.data import ConvertOptions, ConvertReport

__all__ = ["register"]

_ON_ERROR = ("fail", "skip")

_HELP = """Convert SWE-bench Verified / Lite / full / SWE-Gym rows, or NeMo-Gym environment
task rows (responses_create_params), into Miles prompt JSONL.

SWE-bench: each output line is {"prompt": [{"role": "user", "content": problem_statement}],
"metadata": {every instance field, "subset", "split"}}.

NeMo-Gym environments (--env NAME=FILE[:WEIGHT], repeatable; or --input FILE whose rows name
their agent_ref): {"prompt": the input messages, "metadata": {the task row, "nemogym_env",
"nemogym_task_id"}}; weights mix environments into one file, --holdout N holds out N rows
per environment (--holdout-output 'eval/{env}.jsonl' writes one file each).

NeMo-Gym benchmarks (--env BENCHMARK=FILE, FILE its `gym eval prepare` output; --env BENCHMARK
alone when nemo-gym ships its data): evaluation rows with the benchmark's prompt config applied
by nemo-gym, marked "nemogym_benchmark" (its name, grader, repeats, reward range); give the
file to the launcher's --eval-data BENCHMARK=FILE.

Point Miles' --prompt-data at the output with --input-key prompt --metadata-key metadata.
"""


def _refuse(err: Console, message: str, code: int = 2) -> NoReturn:
    """``fail`` with ``message`` printed as plain text (a path's ``[...]`` is not markup)."""
    fail(err, message, code, highlight=False, markup=False)


def _print_summary(console: Console, report: ConvertReport, options: ConvertOptions) -> None:
    from miles_nemogym.data import printable

    # A line of its own, not the table's title: a long path is never split to the table's width.
    console.print(f"convert: {printable(report.source)} ({report.source_kind})", markup=False, highlight=False)
    counts = Table()
    counts.add_column("rows")
    counts.add_column("count", justify="right")
    counts.add_row("read", str(report.rows_read))
    if report.committed:  # the paths go below the table: a path is never cut to fit a cell
        counts.add_row("written", str(report.written))
        if options.holdout:
            counts.add_row("held out", str(report.holdout_written))
    else:
        counts.add_row("written (conversion failed, no file touched)", "0")
    for reason, count in sorted(report.skipped.items(), key=lambda item: (-item[1], item[0])):
        counts.add_row(f"skipped: {reason}", str(count))
    console.print(counts)
    if report.committed:
        console.print(f"written to {options.output}", highlight=False, markup=False)
        held_to: list[Path | None] = [*sorted(set(report.holdout_files.values()))] or [options.holdout_output]
        for path in held_to if options.holdout else ():
            console.print(f"held out to {path}", highlight=False, markup=False)
    if report.usable_by_env:  # NeMo-Gym environment rows
        by_env = Table(title="per environment", title_justify="left")
        for column in ("environment", "usable rows", "written", "repeated", "held out"):
            by_env.add_column(column, justify="left" if column == "environment" else "right")
        for name, usable in report.usable_by_env.items():
            row = (usable, report.written_by_env[name], report.repeated_by_env[name], report.holdout_by_env[name])
            by_env.add_row(Text(name), *map(str, row))
        console.print(by_env)

    repos = sorted(
        set(report.written_by_repo) | set(report.holdout_by_repo) | set(report.not_gradeable_by_repo),
        key=lambda repo: (-report.written_by_repo[repo], repo),
    )
    if repos and report.committed:
        columns = {"written": report.written_by_repo}
        if options.holdout:
            columns["held out"] = report.holdout_by_repo
        if options.gradeable_only:
            columns["dropped: not gradeable"] = report.not_gradeable_by_repo
        by_repo = Table(title="per repo", title_justify="left")
        by_repo.add_column("repo")
        for title in columns:
            by_repo.add_column(title, justify="right")
        for repo in repos:
            by_repo.add_row(Text(printable(repo)), *(str(counts[repo]) for counts in columns.values()))
        console.print(by_repo)

    if report.problems:
        more = report.problem_count - len(report.problems)
        console.print(f"[bold]bad rows[/bold] ({report.problem_count}):", highlight=False)
        for problem in report.problems:
            console.print(f"  {problem}", highlight=False, markup=False)
        if more > 0:
            console.print(f"  … and {more} more", highlight=False)
    if report.duplicates:
        what = "task id" if report.environments else "instance_id"
        console.print(
            f"[bold]duplicate {what}s[/bold] ({report.skipped[f'duplicate {what}']}, first kept):", highlight=False
        )
        for duplicate in report.duplicates:
            console.print(f"  {duplicate}", highlight=False, markup=False)
    for note in report.notes(options):
        console.print(f"note: {note}", highlight=False, markup=False)


def _convert_command(
    output: Annotated[Path, typer.Option("--output", "-o", help="Output JSONL (written atomically).")],
    input: Annotated[
        str | None,
        typer.Option(
            "--input",
            "-i",
            help="Dataset id (princeton-nlp/SWE-bench_Verified), a folder, or a .jsonl/.json/.parquet file "
            "(SWE-bench rows, or NeMo-Gym rows naming their agent_ref).",
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env",
            metavar="NAME=FILE[:WEIGHT]",
            help="NeMo-Gym environment rows (responses_create_params) of environment NAME (repeat to mix; "
            "NAME alone: the rows of --input; swe=FILE: convert's output for SWE-bench rows). "
            "WEIGHT: its share of the output.",
        ),
    ] = None,
    own_envs: Annotated[
        list[str] | None,
        typer.Option(
            "--own-env",
            metavar="NAME",
            help="NAME (an --env's) is your own environment, not one nemo-gym ships: its name is not checked.",
        ),
    ] = None,
    size: Annotated[
        int | None, typer.Option(min=1, help="Rows in a weighted mix (default: the most without repeating a row).")
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(
            help="Split to load (folders, dataset ids) and, for SWE-bench rows, to record in metadata. "
            "Default: the row's own, else test for SWE-bench sets, train for SWE-Gym and NeMo-Gym environments."
        ),
    ] = None,
    subset: Annotated[
        str | None,
        subset_option(
            "Override the subset: verified = official SWE-bench images, gym = SWE-Gym images. "
            "Default: the row's own, else inferred from the dataset name."
        ),
    ] = None,
    on_error: Annotated[
        str,
        typer.Option(
            metavar=metavar(_ON_ERROR),
            callback=choice(_ON_ERROR),
            help="fail: stop, write nothing; skip: write the good rows.",
        ),
    ] = "fail",
    gradeable_only: Annotated[
        bool, typer.Option("--gradeable-only", help="Keep only rows the installed swebench package can grade.")
    ] = False,
    repos: Annotated[list[str] | None, typer.Option(help="Keep only these repos (repeat or comma-separate).")] = None,
    exclude_repos: Annotated[
        list[str] | None, typer.Option("--exclude-repos", help="Drop these repos (repeat or comma-separate).")
    ] = None,
    instance_ids: InstanceIds = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Write at most N rows to --output.")] = None,
    shuffle: Annotated[
        bool, typer.Option("--shuffle", help="Shuffle the selected rows (spools to disk, not memory).")
    ] = False,
    seed: Annotated[
        int | None,
        typer.Option(help="Seed for --shuffle, and for environments' holdout and mixing (default: random, printed)."),
    ] = None,
    holdout: Annotated[
        int,
        typer.Option(min=0, help="Write N selected rows (N per environment) to --holdout-output instead (disjoint)."),
    ] = 0,
    holdout_output: Annotated[
        Path | None,
        typer.Option("--holdout-output", help="Where the --holdout rows go; {env} in it: one file per environment."),
    ] = None,
    drop_fields: Annotated[
        list[str] | None,
        typer.Option("--drop-fields", help="Leave these fields out of metadata (never required ones)."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    from pydantic import ValidationError
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from miles_nemogym.cli._console import console
    from miles_nemogym.data import ConvertError, ConvertOptions, InterruptedAfterCommit, convert
    from miles_nemogym.errors import MilesNemoGymError, problems

    out, err = console(), console(stderr=True)
    with contextlib.ExitStack() as scratch:
        benchmarks: list[str] = []  # the note each benchmark's rows get under the summary
        env = [_benchmark_rows(err, value, input, scratch, benchmarks) for value in env or ()]
        if input is not None and benchmarks and all("=" in value for value in env):
            input = None  # read as a benchmark's prepared file
        try:
            options = ConvertOptions.from_flags(
                env=env,
                instance_ids=instance_ids,
                input=input,
                output=output,
                size=size,
                split=split,
                subset=subset,
                on_error=on_error,
                gradeable_only=gradeable_only,
                repos=tuple(repos or ()),
                exclude_repos=tuple(exclude_repos or ()),
                limit=limit,
                shuffle=shuffle,
                seed=seed,
                holdout=holdout,
                holdout_output=holdout_output,
                drop_fields=tuple(drop_fields or ()),
            )
        except ValidationError as error:
            _refuse(err, "\n".join(f"error: {line}" for line in problems(error)))
        except ValueError as error:  # InputError, or --instance-ids that holds no id
            _refuse(err, f"error: {error}")

        _check_names(err, options, own_envs or [])

        columns = (SpinnerColumn(), TextColumn("converting"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"))
        with interrupt_on_signals():
            try:  # each refusal below is printed once the bar is gone
                with Progress(*columns, TimeElapsedColumn(), console=err, disable=quiet, transient=True) as bar:
                    task = bar.add_task("convert", total=None)
                    report = convert(
                        options, progress=lambda done, total: bar.update(task, completed=done, total=total)
                    )
            except InterruptedAfterCommit as stop:
                _refuse(err, f"interrupted once every file was written: {', '.join(map(str, stop.paths))}", 130)
            except KeyboardInterrupt:
                _refuse(err, "interrupted: nothing written, no file touched", 130)
            except ConvertError as error:
                _print_summary(err, error.report, options)
                _refuse(err, f"error: {error}", 1)
            except (MilesNemoGymError, ValueError) as error:  # SourceError, WriteError, no swebench...
                _refuse(err, f"error: {error}", 1)
            except OSError as error:  # e.g. an input that cannot be read
                said = f"{error.filename}: {error.strerror}" if error.filename and error.strerror else str(error)
                _refuse(err, f"error: {said}", 1)
        _print_summary(out, report, options)
        for note in benchmarks:
            out.print(note, highlight=False, markup=False)


def _benchmark_rows(
    err: Console, value: str, input: str | None, scratch: contextlib.ExitStack, notes: list[str]
) -> str:
    """``value`` as given, or for a NeMo-Gym benchmark ``GRADER=ROWS[:WEIGHT]`` (ROWS: its rows, materialized)."""
    from miles_nemogym.gym.benchmarks import find_benchmark
    from miles_nemogym.gym.catalog import UnknownCatalogNameError
    from miles_nemogym.gym.venv import GymEnvironmentError

    name, sep, rest = value.partition("=")
    try:  # strict: neither a file of rows nor a benchmark, so say what is close
        progress = functools.partial(err.print, highlight=False, markup=False)
        found = find_benchmark(name.strip(), progress, strict=not sep and input is None)
    except UnknownCatalogNameError as error:
        _refuse(err, f"error: --env {value}: {error}")
    except GymEnvironmentError as error:
        _refuse(err, f"error: --env {value}: {error}", 1)
    if found is None:
        return value
    entry = found.entry
    head, colon, tail = rest.rpartition(":")
    weighted = bool(colon and head and not Path(rest).expanduser().exists())
    source = Path(head if weighted else rest).expanduser() if sep else (Path(input) if input else found.shipped_data())
    if source is None:
        _refuse(
            err,
            f"error: --env {value}: nemo-gym does not ship benchmark {entry.name}'s data; give its "
            f"prepared file as --env {entry.name}=FILE (`gym eval prepare --benchmark {entry.name}` writes it)",
        )
    if not source.is_file():
        _refuse(err, f"error: --env {value}: {source}: no such file")
    folder = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="mng-bench-")))
    rows = folder / "rows.jsonl"
    try:
        mark = found.rows(source, rows)
    except GymEnvironmentError as error:  # a benchmark that cannot become rows here
        _refuse(err, f"error: --env {value}: {error}")
    span = " to ".join(map(str, mark.reward_range)) if mark.reward_range else "unknown"
    better = {True: ", higher is better", False: ", lower is better", None: ""}[mark.higher_is_better]
    notes.append(
        f"benchmark {mark.name} (the rows of {source}, its prompt config applied by nemo-gym): "
        f"graded by {mark.environment}, {mark.num_repeats} samples per prompt, "
        f"reward {span}{better}; evaluate with --eval-data {mark.name.replace('/', '.')}=FILE"
    )
    return f"{mark.environment}={rows}" + (f":{tail}" if weighted else "")


def _check_names(err: Console, options: ConvertOptions, own: list[str]) -> None:
    """Each --env name is one nemo-gym ships, unless --own-env says it is the user's; else exit 2."""
    from miles_nemogym.episode.record import SWE_ENVIRONMENT
    from miles_nemogym.gym.environments import check_shipped

    given = [entry.name for entry in options.environments if entry.name]
    for name in own:
        if name not in given:
            _refuse(err, f"error: --own-env {name}: no --env names {name!r}")
    names = [name for name in given if name != SWE_ENVIRONMENT and name not in own]
    if not names:
        return
    try:
        unknown = check_shipped(names)
    except (OSError, RuntimeError) as error:  # the wheel could not be downloaded or read
        _refuse(
            err,
            f"error: --env: cannot check the names against nemo-gym's ({error}); "
            "add --own-env NAME for each to convert without the check",
            1,
        )
    if unknown:
        own_fix = "Give the name it ships, or add --own-env NAME for an environment of your own."
        _refuse(err, f"error: --env: {unknown} {own_fix}")


def register(app: typer.Typer) -> None:
    app.command("convert", help=_HELP)(_convert_command)
