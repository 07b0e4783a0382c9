"""``miles-nemogym examples``: the task rows nemo-gym ships, as a file to try things on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from miles_nemogym.cli._console import console, interrupt_on_signals

__all__ = ["register"]

_HELP = """Write the five SWE-bench Verified rows nemo-gym ships (raw rows, one JSON object per
line) to --output, or to standard output. Try the converter on them offline:
miles-nemogym convert --input examples.jsonl --output prompts.jsonl

--env NAME writes the example rows of environment NAME instead (e.g. mcqa, xlam_fc,
calendar_v2): miles-nemogym convert --env mcqa=mcqa.jsonl --output prompts.jsonl
"""


def _examples(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Where to write the rows (default: standard output).")
    ] = None,
    env: Annotated[
        str | None, typer.Option("--env", metavar="NAME", help="The example rows of this NeMo-Gym environment instead.")
    ] = None,
) -> None:
    from miles_nemogym.data import InterruptedAfterCommit, output_problem, write_file
    from miles_nemogym.gym.environments import shipped_examples
    from miles_nemogym.pins import NEMO_GYM_VERSION

    problem = output_problem(output.expanduser()) if output is not None else None
    if problem:  # before the wheel is read: a link is never written through, a device never replaced
        typer.echo(f"error: --output {output} {problem}", err=True)
        raise typer.Exit(2)
    try:
        text, source, wheel = shipped_examples(env)
    except ValueError as error:
        console(stderr=True).print(f"error: {error}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    except (OSError, RuntimeError) as error:
        typer.echo(f"error: cannot read nemo-gym {NEMO_GYM_VERSION}'s example rows: {error}", err=True)
        raise typer.Exit(1) from None
    if output is None:
        sys.stdout.write(text)
    else:
        # The converter's writer: a new file moved over the old one once complete, never the old one truncated.
        try:
            with interrupt_on_signals():
                write_file(output.expanduser(), text.encode("utf-8"))
        except OSError as error:  # it names the file and the reason
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(1) from None
        except InterruptedAfterCommit:
            typer.echo(f"interrupted: {output} was written", err=True)
            raise typer.Exit(130) from None
        except KeyboardInterrupt:
            typer.echo(f"interrupted: nothing written, {output} untouched", err=True)
            raise typer.Exit(130) from None
        typer.echo(f"wrote {sum(1 for line in text.splitlines() if line.strip())} rows to {output}")
    # On stderr, so `examples > rows.jsonl` stays pure JSONL; the wheel's path (its name gives the
    # version) on a line of its own, so both fit 80 columns.
    typer.echo(f"source: {source}\n  in {wheel}", err=True)


def register(app: typer.Typer) -> None:
    app.command("examples", help=_HELP)(_examples)
