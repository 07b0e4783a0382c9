"""Options several subcommands share, defined once so their grammar and help agree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from miles_nemogym.cli._console import fail
from miles_nemogym.data import SUBSETS
from miles_nemogym.gym.config import SANDBOXES

if TYPE_CHECKING:
    from rich.console import Console

    from miles_nemogym.gym.composition import Judge

__all__ = [
    "JUDGE_MODEL_HELP",
    "JUDGE_URL_HELP",
    "SANDBOXES",
    "GymUrl",
    "InstanceIds",
    "choice",
    "judge_of",
    "metavar",
    "subset_option",
]


JUDGE_URL_HELP = (
    "Base URL of an OpenAI-compatible server (e.g. http://judge:8000/v1) that grades the --env "
    "environments whose configs judge with a model; its key, if any, is read from NEMO_GYM_JUDGE_API_KEY."
)
JUDGE_MODEL_HELP = "The model name the --judge-url server serves."


def judge_of(console: Console, url: str | None, model: str | None) -> Judge | None:
    """The judge ``--judge-url``/``--judge-model`` name (None: neither); ``typer.Exit(2)`` naming a bad one."""
    from pydantic import ValidationError
    from rich.markup import escape

    from miles_nemogym.errors import problems
    from miles_nemogym.gym.composition import Judge

    if url is None and model is None:
        return None
    if url is None or model is None:
        given, lacking = ("--judge-url", "--judge-model") if url else ("--judge-model", "--judge-url")
        fail(console, f"[red]error:[/red] {given} needs {lacking} too: a judge is an endpoint and a model name")
    try:
        return Judge(url=url, model=model)
    except ValidationError as exc:
        for line in problems(exc, lambda loc: "--judge-" + ".".join(map(str, loc))):
            console.print(f"[red]error:[/red] {escape(line)}", highlight=False)
        raise typer.Exit(2) from None


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
    str | None, typer.Option("--gym-url", help="The mini_swe_agent_2 server's base URL (default: NEMO_GYM_URL).")
]
InstanceIds = Annotated[str | None, typer.Option("--instance-ids", metavar="FILE|ID,ID", help=_INSTANCE_IDS_HELP)]


def subset_option(help: str) -> Any:
    """``--subset`` with its choices shown in help and a plain message for a wrong one."""
    return typer.Option("--subset", metavar=metavar(SUBSETS), callback=choice(SUBSETS), help=help)
