"""Entry point of the ``miles-nemogym`` command: registers each feature's subcommand."""

from __future__ import annotations

import inspect
from typing import Annotated

import typer

__all__ = ["app"]

app = typer.Typer(
    name="miles-nemogym",
    help="Train Miles agents on NeMo-Gym environments: convert data, serve and check "
    "the environment, scan it, and run the smoke test.",
    add_completion=False,
    rich_markup_mode=None,
)


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"miles-nemogym {version('miles-nemogym')}")
        raise typer.Exit(0)


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    show_version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """miles-nemogym command line."""
    if ctx.invoked_subcommand is None:
        # Bare `miles-nemogym` is a request for help, as with git or pip: show it, exit 0.
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


# Each feature module exposes `register(app)`; explicit imports, so a missing module is an
# import error rather than a silently absent subcommand.
import miles_nemogym.cli._convert as convert  # noqa: E402
import miles_nemogym.cli._doctor as doctor  # noqa: E402
import miles_nemogym.cli._environments as environments  # noqa: E402
import miles_nemogym.cli._episodes as episodes  # noqa: E402
import miles_nemogym.cli._examples as examples  # noqa: E402
import miles_nemogym.cli._scan as scan  # noqa: E402
import miles_nemogym.cli._serve as serve  # noqa: E402
import miles_nemogym.cli._smoke as smoke  # noqa: E402

for _feature in (convert, doctor, environments, episodes, examples, scan, serve, smoke):
    _feature.register(app)


def _first_sentence(text: str) -> str:
    paragraph = " ".join(text.split("\n\n")[0].split())
    return paragraph.split(". ")[0].rstrip(".") + "."


# The command list shows each command's whole first sentence, wrapped between words: without a
# short help, click cuts the description to one line with "...".
for _info in app.registered_commands:
    if _info.short_help is None:
        _info.short_help = _first_sentence(_info.help or inspect.getdoc(_info.callback) or "")

if __name__ == "__main__":
    app()
