"""Entry point of the ``miles-nemogym`` command: registers each feature's subcommand.

Subcommand modules import their heavy dependencies (datasets, the scan) inside the
command bodies, so ``miles-nemogym --help`` stays fast.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="miles-nemogym",
    help="Train Miles agents on NeMo-Gym environments: convert data, serve and check "
    "the environment, scan it, and run the smoke test.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """miles-nemogym command line."""


# Each feature module exposes `register(app)`; explicit imports, so a missing module is an
# import error rather than a silently absent subcommand.
from miles_nemogym.cli import convert, doctor, episodes, scan, serve, smoke  # noqa: E402

for _feature in (convert, doctor, episodes, scan, serve, smoke):
    _feature.register(app)

if __name__ == "__main__":
    app()
