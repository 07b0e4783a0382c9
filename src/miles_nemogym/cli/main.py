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


# Registration: each feature module exposes `register(app)`.
# (kept as explicit imports so a missing module is an import error, not a silent gap)
from miles_nemogym.cli import convert as _convert  # noqa: E402

_convert.register(app)
from miles_nemogym.cli import doctor as _doctor  # noqa: E402

_doctor.register(app)
from miles_nemogym.cli import scan as _scan  # noqa: E402

_scan.register(app)
from miles_nemogym.cli import serve as _serve  # noqa: E402

_serve.register(app)

if __name__ == "__main__":
    app()
