"""``miles-nemogym examples``: the SWE-bench Verified rows nemo-gym ships, as a file to try things on.

They come from the pinned nemo-gym wheel (downloaded once with pip into the cache), so
``convert``, ``scan`` and ``smoke`` can be tried without the dataset hub.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

_HELP = """Write the five SWE-bench Verified rows nemo-gym ships (raw rows, one JSON object per
line) to --output, or to standard output. Try the converter on them offline:
miles-nemogym convert --input examples.jsonl --output prompts.jsonl
"""


def _examples(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Where to write the rows (default: standard output).")
    ] = None,
) -> None:
    from miles_nemogym.gym import wheel as gym_wheel
    from miles_nemogym.pins import NEMO_GYM_VERSION

    try:
        rows = gym_wheel.example_rows()
        source = f"{gym_wheel.EXAMPLES_MEMBER} in {gym_wheel.wheel_path()}"
    except (OSError, RuntimeError) as error:
        typer.echo(f"error: cannot read nemo-gym {NEMO_GYM_VERSION}'s example rows: {error}", err=True)
        raise typer.Exit(1) from None
    text = "".join(json.dumps(row) + "\n" for row in rows)
    if output is None:
        sys.stdout.write(text)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {len(rows)} rows to {output}")
    # On stderr, so `examples > rows.jsonl` stays pure JSONL.
    typer.echo(f"source: nemo-gym {NEMO_GYM_VERSION}, {source}", err=True)


def register(app: typer.Typer) -> None:
    app.command("examples", help=_HELP)(_examples)
