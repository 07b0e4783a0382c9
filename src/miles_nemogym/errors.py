"""The exceptions miles-nemogym raises on purpose, and the three an episode turns into a failure kind.

    MilesNemoGymError                every exception the package defines derives from it
    ├── RunStopped                   the run cannot go on: raised by the group filter, it ends Miles' rollout
    ├── Failed                       a request got no usable answer (no HTTP answer, or one that is
    │                                not what the step needs) → an episode under it: its ``kind``
    ├── SettingsError                a NEMO_GYM_* variable (or a flag standing in for one) is malformed
    │                                → an episode under it: ``miles_nemogym:invalid_config``
    └── RequestError                 the task row, the sampling keys or Miles' session URL cannot
        │                            form the episode's requests → ``miles_nemogym:invalid_request``
        └── UrlError                 a URL that is not a plain http(s) base URL (``transport.check_url``)

Each subclass keeps its builtin base too (``ValueError``, ...); the other modules' errors
(``FetchError``, ``ConvertError``, ...) derive from ``MilesNemoGymError`` directly.

A pydantic ``ValidationError`` becomes a message one way (:func:`describe`, :func:`problems`) for
every caller: settings, the launcher's recipe, the scan/convert/serve flags, the ``/run`` body;
only how a field is named differs (a variable, a flag, a dotted path), the one parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import ValidationError
from pydantic_core import ErrorDetails

__all__ = [
    "Failed",
    "MilesNemoGymError",
    "RequestError",
    "RunStopped",
    "SettingsError",
    "UrlError",
    "as_flag",
    "counted",
    "describe",
    "message",
    "problems",
]


class MilesNemoGymError(Exception):
    """Raised on purpose by miles-nemogym."""


class SettingsError(MilesNemoGymError, ValueError):
    """A configuration value is missing or malformed; the message names the variable and the fix."""


class RequestError(MilesNemoGymError, ValueError):
    """A sample cannot form its episode's requests; the message names the field and the fix."""


class UrlError(RequestError):
    """A URL the package would send to is not a plain ``http(s)`` base URL; the message says why."""


class RunStopped(MilesNemoGymError, RuntimeError):
    """The run cannot go on (an outage past ``NEMO_GYM_OUTAGE_TIMEOUT``, a failure streak): the one
    exception meant to leave a hook (the group filter's, which ends Miles' rollout)."""


class Failed(MilesNemoGymError):
    """A step of an episode failed under failure kind ``kind`` (``failure_kinds``), the one failure
    type from the transport to the record. ``resendable``: the request certainly never reached the
    server and its deadline has not passed, so the episode may be sent again; ``policy``: an
    ``agent_timeout`` while the policy held the episode (whose timeout it is); ``answered``: the
    server's answer had begun (its status and headers came), so a timeout is the server's;
    ``aborted``: Miles aborted the policy's generation (our abort, never a server's verdict)."""

    def __init__(
        self,
        kind: str,
        reason: str,
        *,
        resendable: bool = False,
        policy: bool = False,
        aborted: bool = False,
        os_error: OSError | None = None,
    ) -> None:
        super().__init__(reason)
        self.kind = kind
        self.resendable = resendable
        self.policy = policy
        self.aborted = aborted
        self.answered = False
        self.os_error = os_error
        """What the operating system said, for callers that explain a failure (doctor)."""


# ----------------------------------------------------------------------------- words of a message


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` agreeing in number: ``1 server``, ``2 servers``, ``0 servers``
    (``plural`` for a noun that takes no plain ``s``: ``counted(2, "match", "matches")``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


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
