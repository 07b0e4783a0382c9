"""Options several subcommands share, defined once so their grammar and help agree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, get_args

import typer

from miles_nemogym.data.schema import SUBSETS
from miles_nemogym.gym.config import SandboxName

SANDBOXES: tuple[str, ...] = get_args(SandboxName)

_INSTANCE_IDS_HELP = (
    "Keep only these instances: a file with one id per line (# starts a comment), or a comma-separated list of ids."
)


def choice(choices: Sequence[str]) -> Callable[[str | None], str | None]:
    """A callback refusing anything but ``choices``, in click's own words (no pydantic wording)."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"{value!r} is not one of: {', '.join(choices)}.")
        return value

    return check


def metavar(choices: Sequence[str]) -> str:
    return "[" + "|".join(choices) + "]"


GymUrl = Annotated[
    str | None,
    typer.Option("--gym-url", help="The mini_swe_agent_2 server's base URL (default: NEMO_GYM_URL)."),
]
InstanceIds = Annotated[str | None, typer.Option("--instance-ids", metavar="FILE|ID,ID", help=_INSTANCE_IDS_HELP)]


def subset_option(help: str) -> Any:
    """``--subset`` with its choices shown in help and a plain message for a wrong one."""
    return typer.Option("--subset", metavar=metavar(SUBSETS), callback=choice(SUBSETS), help=help)
