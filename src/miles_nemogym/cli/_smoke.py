"""``miles-nemogym smoke``: see the whole chain work on a laptop (no GPU, no Docker)."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from miles_nemogym.cli._console import fail, interrupt_on_signals
from miles_nemogym.cli._options import JUDGE_MODEL_HELP, JUDGE_URL_HELP, judge_of
from miles_nemogym.errors import counted

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from miles_nemogym.gym.composition import Judge

__all__ = ["register"]

_EXPLANATION = (
    "This run used the 'local' sandbox: commands ran on this machine, not in the SWE-bench task "
    "containers, so grading cannot resolve instances (reward 0.0 is expected). For the real "
    "thing, on a Docker host (NeMo-Gym's docker provider): check the instances with `miles-nemogym serve "
    "--sandbox docker --golden` and `miles-nemogym scan --golden`, then run `miles-nemogym serve --sandbox "
    "docker` and train with examples/swebench_grpo/run.py."
)

_EPISODE_DIR = "miles-nemogym-smoke-episodes"
"""The episode store smoke writes when neither --episode-dir nor NEMO_GYM_EPISODE_DIR names one."""

_HELP = """Run the five SWE-bench Verified rows nemo-gym ships through the real NeMo-Gym server and
the agent function, exactly as Miles calls it (no GPU, no Docker).

--env NAME (repeatable) runs a NeMo-Gym environment's shipped rows instead: its resources
server (and agent server) as `serve --env` starts them, each row played with its gold and a
wrong answer by the scripted policy (gold scores 1.0, wrong 0.0), or by --policy-base-url.

The first run builds the server's Python 3.13 environment (2-5 minutes, once; pip's log is
kept next to it) under ~/.cache/miles-nemogym/gym-venv, or $MILES_NEMOGYM_CACHE. The
interpreter is found on PATH, in pyenv or /usr/bin, or named by MILES_NEMOGYM_GYM_PYTHON.
"""


@contextmanager
def _running(console: Console, servers: str) -> Iterator[Callable[[str], None]]:
    """The step display, the agent's warnings off (the table shows each failed episode with its
    reason); ``typer.Exit(2)`` when ``servers`` cannot start."""
    from miles_nemogym.cli._console import step_display
    from miles_nemogym.gym.venv import GymEnvironmentError

    logger, handler = logging.getLogger("miles_nemogym"), logging.NullHandler()
    previous, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        with step_display(console) as progress:
            yield progress
    except GymEnvironmentError as error:
        fail(console, f"[red]cannot start {servers}:[/red] {escape(str(error))}", highlight=False)
    finally:
        logger.removeHandler(handler)
        logger.propagate = previous


def _smoke(
    policy_base_url: Annotated[
        str | None,
        typer.Option(
            "--policy-base-url",
            help="A real OpenAI-compatible endpoint (its URL ending in /v1) instead of the scripted recording policy; "
            "its key from NEMO_GYM_POLICY_API_KEY.",
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=5, help="Run only the first N rows.")] = None,
    step_limit: Annotated[int, typer.Option("--step-limit", min=1, help="Model calls per episode.")] = 10,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="Where the server's log and trajectories go (kept).")
    ] = None,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep", help="Keep the temporary folder with the server's log and trajectories (removed by default)."
        ),
    ] = False,
    episode_dir: Annotated[
        Path | None,
        typer.Option(
            "--episode-dir", help=f"The episode store to write (default: $NEMO_GYM_EPISODE_DIR, else ./{_EPISODE_DIR})."
        ),
    ] = None,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", help="Also write the result as JSON to this file (one object, every episode)."),
    ] = None,
    envs: Annotated[
        list[str] | None,
        typer.Option(
            "--env",
            metavar="NAME",
            help="A NeMo-Gym environment (e.g. mcqa) whose shipped rows to run instead of SWE; repeatable.",
        ),
    ] = None,
    judge_url: Annotated[str | None, typer.Option("--judge-url", metavar="URL", help=JUDGE_URL_HELP)] = None,
    judge_model: Annotated[str | None, typer.Option("--judge-model", metavar="NAME", help=JUDGE_MODEL_HELP)] = None,
) -> None:
    from miles_nemogym import checks
    from miles_nemogym.cli._console import console as cli_console
    from miles_nemogym.cli._doctor import show
    from miles_nemogym.data import output_problem
    from miles_nemogym.gym import wheel as gym_wheel

    console = cli_console()
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        # Its log reads as the smallest terminal shows it: 80 columns, wrapped between words, a
        # path longer than that whole on a line of its own.
        console.width, console.soft_wrap = 80, False
    # Before anything starts: the plugin's variables and, given one, that the real policy answers.
    target = checks.Target.from_env(policy_base_url=policy_base_url)
    wanted: list[checks.Wanted] = ["settings"] if policy_base_url is None else ["settings", "policy answers"]
    failed = [result for result in checks.run(target, wanted) if not result.ok]
    if failed:
        show(console, failed)
        raise typer.Exit(2)
    problem = output_problem(json_path) if json_path is not None else None
    if problem:  # before any server starts: a link is never written through, a device never replaced
        fail(console, "[red]error:[/red] --json " + escape(f"{json_path} {problem}"), highlight=False)
    judge = judge_of(console, judge_url, judge_model)
    if envs:
        from miles_nemogym.gym.venv import GymEnvironmentError
        from miles_nemogym.smoke import check_environments

        try:
            check_environments(envs, judge)  # before anything starts: a typo or a refused environment, with the reason
        except GymEnvironmentError as error:
            fail(console, f"[red]error:[/red] --env: {escape(str(error))}", highlight=False)
        played = "played by your model" if policy_base_url else "played with its gold and a wrong answer"
        console.print(f"smoke: {counted(len(envs), 'environment')}, each shipped row {played}:", highlight=False)
        for line in textwrap.wrap(", ".join(envs), 78, break_long_words=False, break_on_hyphens=False):
            console.print(f"  {line}", highlight=False)
    else:
        if judge is not None:
            fail(console, "[red]error:[/red] --judge-url grades --env environments; the SWE smoke has no judge")
        try:
            rows = gym_wheel.example_rows()[:limit]
        except (OSError, RuntimeError) as error:  # the pinned wheel could not be downloaded or read
            said = escape(str(error))
            fail(console, f"[red]cannot read the example rows nemo-gym ships:[/red] {said}", highlight=False)
    store = episode_dir or Path(os.environ.get("NEMO_GYM_EPISODE_DIR", "").strip() or _EPISODE_DIR)
    store = Path(os.path.abspath(store.expanduser()))  # the closing hint works from any folder (no link resolved)
    folder = state_dir or Path(tempfile.mkdtemp(prefix="miles-nemogym-smoke-"))
    kept = state_dir is not None or keep
    worked = interrupted = False
    try:
        if envs:  # its report prints once SIGTERM is back to what it was
            worked = _run_environments(console, envs, judge, policy_base_url, limit, folder, store, json_path)
        else:
            with interrupt_on_signals(ctrl_c=True):
                worked = _run(console, rows, folder, store, kept, policy_base_url, limit, step_limit, json_path)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if interrupted:  # the servers are stopped: the folder smoke made is removed, a kept one named
            if kept:
                console.print(f"interrupted; what the run wrote is in {folder}", highlight=False, soft_wrap=True)
            else:
                shutil.rmtree(folder, ignore_errors=True)
                console.print("interrupted; nothing left running, nothing left behind.", highlight=False)
        elif not kept and worked:
            shutil.rmtree(folder, ignore_errors=True)
        elif envs and not kept and not any(folder.iterdir()):  # it failed before any server started
            folder.rmdir()
        elif envs:
            console.print(f"the servers' logs: {folder}", highlight=False, soft_wrap=True)
        elif not kept:
            console.print(f"kept {folder} (the server's log and trajectories) since the run failed", highlight=False)
    if not worked:
        raise typer.Exit(130 if interrupted else 1)


def _write_json(console: Console, path: Path, report: dict[str, Any]) -> None:
    """The report at ``path`` by ``convert``'s writer: a new file moved into place, never through a link."""
    from miles_nemogym.data import write_file

    try:
        write_file(path, (json.dumps(report, indent=2) + "\n").encode("utf-8"))
    except OSError as error:  # it names the file and the reason
        fail(console, f"[red]error:[/red] --json: {escape(str(error))}", 1, highlight=False)
    console.print(f"json: {path}", highlight=False)


def _print_tables(console: Console, tables: list[Table], notes: list[str], legend: str) -> None:
    """The report's tables, their numbered notes, the legend."""
    for table in tables:
        console.print(table)
    for number, text in enumerate(notes, 1):
        console.print(f"[{number}] {text}", highlight=False, markup=False)
    console.print(legend, highlight=False)


def _store_hint(console: Console, store: Path, step: int | None, errors: int) -> None:
    """Where the run's episodes went and the command that browses them."""
    if errors:
        console.print(
            f"[red]the episode store {store} could not write "
            f"{counted(errors, 'episode or seal', 'episodes or seals')}[/red]",
            highlight=False,
        )
    console.print(f"episodes stored as train step {step}; look at them with:", highlight=False)
    # Never wrapped: the command is copied as it is, however long the folder's path.
    console.print(f"  miles-nemogym episodes {shlex.quote(str(store))}", highlight=False, soft_wrap=True)


def _run_environments(
    console: Console,
    envs: list[str],
    judge: Judge | None,
    policy_base_url: str | None,
    limit: int | None,
    folder: Path,
    store: Path,
    json_path: Path | None,
) -> bool:
    """``smoke --env``: a line per episode, a table per environment; whether the chain worked."""
    from miles_nemogym.smoke import run_environment_smoke

    with interrupt_on_signals(ctrl_c=True), _running(console, "the environments' servers") as progress:
        report = run_environment_smoke(
            envs,
            state_dir=folder,
            episode_dir=store,
            limit=limit or 5,
            judge=judge,
            policy_base_url=policy_base_url,
            progress=progress,
            on_episode=lambda line: console.print(line, highlight=False),
        )
    _print_tables(console, *report.tables(), report.LEGEND)
    if json_path is not None:
        _write_json(console, json_path, report.json())
    if not report.chain_worked:
        console.print(
            "[red]the chain did not work: the episodes with a note above did not come back as "
            f"expected; the servers' logs are in {folder}[/red]",
            highlight=False,
        )
    _store_hint(console, store, report.step, report.store_errors)
    return report.chain_worked


def _run(
    console: Console,
    rows: list[dict[str, Any]],
    folder: Path,
    store: Path,
    kept: bool,
    policy_base_url: str | None,
    limit: int | None,
    step_limit: int,
    json_path: Path | None,
) -> bool:
    """The run and its report; whether the chain worked."""
    from miles_nemogym.smoke import expected_offline, run_smoke

    offline = [rows[i]["instance_id"] for i in expected_offline([row["repo"] for row in rows])]
    console.print(f"smoke: {len(rows)} SWE-bench Verified rows through the real NeMo-Gym server", highlight=False)
    if offline:
        console.print(
            f"expected here: without network, {' and '.join(offline)} come back set aside: their "
            "eval scripts download test requirements from GitHub.",
            highlight=False,
        )
    done = 0
    with _running(console, "the NeMo-Gym server") as progress:

        def finished(line: str) -> None:
            nonlocal done
            done += 1
            console.print(line, highlight=False)
            progress(f"  {len(rows) - done} running, {done} done")

        report = run_smoke(
            state_dir=folder,
            episode_dir=store,
            trajectories_kept=kept,
            limit=limit,
            policy_base_url=policy_base_url,
            step_limit=step_limit,
            progress=progress,
            on_episode=finished,
            on_running=lambda count: progress(f"  {count} running, 0 done"),
        )

    table, notes = report.table()
    _print_tables(console, [table], notes, report.LEGEND)
    if kept:
        for name, path in (("prompt data", report.data_path), ("trajectories and results", report.results_dir)):
            console.print(f"{name}: {path}", highlight=False, soft_wrap=True)
        console.print(f"server log: {report.server_log}", highlight=False, soft_wrap=True)
    if json_path is not None:
        document = report.json()
        if report.chain_worked and not kept:  # the folder is removed below: its paths would name nothing
            document.update(prompt_data=None, results_dir=None, server_log=None)
        _write_json(console, json_path, document)
    console.print(_EXPLANATION, highlight=False)
    if not report.chain_worked:
        console.print("[red]the chain did not work: no episode came back as a valid measurement[/red]")
    elif not kept:
        console.print(f"removed {folder} (the server's log and trajectories); --keep keeps it", highlight=False)
    _store_hint(console, store, report.step, report.store_errors)
    return report.chain_worked


def register(app: typer.Typer) -> None:
    app.command("smoke", help=_HELP)(_smoke)
