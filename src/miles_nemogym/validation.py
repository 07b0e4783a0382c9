"""One way to turn a pydantic ``ValidationError`` into a message that names the field and the fix.

Every caller (settings, launcher recipe, scan and convert flags, ``serve`` options, the
``/run`` body builder) uses :func:`describe` or :func:`problems`; only how a field is
named differs (an env variable, a flag, a dotted path), so that is the one parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import ValidationError
from pydantic_core import ErrorDetails

__all__ = ["as_flag", "describe", "message", "problems"]

Loc = Sequence[int | str]
Label = Callable[[Loc], str]


def _dotted(prefix: str = "") -> Label:
    """Name a field by its dotted path, under ``prefix`` when given (``metadata.repo``)."""

    def label(loc: Loc) -> str:
        return ".".join(str(part) for part in ([prefix] if prefix else []) + list(loc))

    return label


def as_flag(loc: Loc) -> str:
    """Name a field by the command-line flag that sets it (``step_limit`` → ``--step-limit``)."""
    return "--" + "-".join(str(part) for part in loc).replace("_", "-")


def message(item: ErrorDetails, *, unknown_key: str | None = None) -> str:
    """What is wrong with one field: pydantic's text without its "Value error, " prefix;
    ``unknown_key`` replaces it for a key the model forbids."""
    if unknown_key is not None and item["type"] == "extra_forbidden":
        return unknown_key
    return str(item["msg"]).removeprefix("Value error, ")


def problems(error: ValidationError, label: Label | None = None, *, unknown_key: str | None = None) -> list[str]:
    """One ``<field>: <problem>`` line per error (just ``<problem>`` when the field has no name)."""
    name = label or _dotted()
    lines = []
    for item in error.errors(include_url=False):
        field = name(item["loc"])
        text = message(item, unknown_key=unknown_key)
        lines.append(f"{field}: {text}" if field else text)
    return lines


def describe(
    error: ValidationError,
    prefix: str = "",
    *,
    label: Label | None = None,
    unknown_key: str | None = None,
    separator: str = "; ",
) -> str:
    """:func:`problems` in one string; ``prefix`` names the fields' parent unless ``label`` is given."""
    return separator.join(problems(error, label or _dotted(prefix), unknown_key=unknown_key))
