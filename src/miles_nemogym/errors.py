"""The failure vocabulary: the exceptions miles-nemogym raises on purpose (three of them an episode
turns into a failure kind), the failure kinds recorded on a sample, and a failure's words, which
never show a secret.

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

The failure kinds (``Failed.kind``, a record's ``failure_kind``) are NeMo-Gym's vocabulary, seen
from the client. An episode that did not produce a valid measurement must say so on the sample,
under a name that groups well in metrics and filter reasons. We reuse the names of
``nemo_gym.failure_kinds`` (not imported: the trainer's environment does not install
nemo-gym) so that a failure observed by this client and one reported by the server land
under the same label, and add ``miles_nemogym:<kind>`` names, namespaced as NeMo-Gym
asks, only for what NeMo-Gym has no name for.

As in NeMo-Gym, a name says what went wrong and nothing else: whether the reward is
masked and whether the request may be sent again are decided per occurrence: by the episode
kinds (``episode/run.py``, ``episode/environment.py``) and the transport's table (``transport.py``).

What may be shown of a secret: ``redact_url`` / ``redact_urls`` hide URL passwords wherever a URL is
printed, logged or recorded. ``KeyScrubber`` removes the policy API key, in every encoding a server may
echo it, from outside text before anything parses, quotes or cuts it (docs/episode-pipeline.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError
from pydantic_core import ErrorDetails

__all__ = [
    "AGENT_TIMEOUT",
    "REDACTED",
    "TRANSPORT_TIMEOUT",
    "TRANSPORT_TLS",
    "TRANSPORT_UNREACHABLE",
    "Failed",
    "MilesNemoGymError",
    "RequestError",
    "RunStopped",
    "SettingsError",
    "counted",
    "describe",
    "message",
    "problems",
    "redact_url",
    "redact_urls",
    "scrub_all",
]

logger = logging.getLogger(__name__)


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
    """A step of an episode failed under failure kind ``kind`` (below), the one failure
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


# ----------------------------------------------------------------------------- failure kinds

# The server could not be reached at all: the request certainly never arrived.
TRANSPORT_UNREACHABLE: Final = "transport_unreachable"
# The connection broke after the request may have been delivered.
TRANSPORT_PEER_DROP: Final = "transport_peer_drop"
# Connecting took longer than the connect timeout.
TRANSPORT_TIMEOUT: Final = "transport_timeout"
# The TLS handshake with an ``https`` server failed (its certificate refused, expired, or for
# another host): the request never left, and it cannot until the certificate is fixed.
TRANSPORT_TLS: Final = "miles_nemogym:transport_tls"
# The agent server answered and the episode broke (HTTP 5xx, ``{error, traceback}``,
# an unreadable body).
AGENT_RUN_ERROR: Final = "agent_run_error"
# Something answered but the episode never ran (HTTP 4xx such as a 422 schema error).
AGENT_REQUEST_FAILED: Final = "agent_request_failed"
# The episode's deadline (``NEMO_GYM_RUN_TIMEOUT``, each try's) passed while waiting.
AGENT_TIMEOUT: Final = "agent_timeout"
# The deadline passed while the policy held the episode (its turns, its tool calls): on a valid
# record scored its lowest reward (``NEMO_GYM_TIMEOUT_REWARD=lowest``, or 0 under ``zero``), a
# status like a step limit, not a failure.
POLICY_TIMEOUT: Final = "miles_nemogym:policy_timeout"
# ``abort`` stopped the episode (Miles' over-sampling abort).
CANCELLED: Final = "cancelled"

# Before any request: the task row or sampling parameters cannot form a valid body.
INVALID_REQUEST: Final = "miles_nemogym:invalid_request"
# Before any request: the plugin's configuration (environment variables) is invalid.
INVALID_CONFIG: Final = "miles_nemogym:invalid_config"
# A defect in this plugin surfaced while running the episode (logged with its traceback).
CLIENT_ERROR: Final = "miles_nemogym:client_error"

# Environment episodes (the ``simple_agent`` loop, docs/environments.md):
# ``POST /seed_session`` answered an error or a body that is not a JSON object.
SEED_FAILED: Final = "miles_nemogym:seed_failed"
# The policy's chat-completions endpoint (Miles' session URL) answered an error or garbage.
POLICY_FAILED: Final = "miles_nemogym:policy_failed"
# NeMo-Gym's name: ``/verify`` answered an error, a body without a finite ``reward``, or one
# outside ``NEMO_GYM_REWARD_RANGE``. (A server may send it too.)
VERIFIER_ERROR: Final = "verifier_error"


# NeMo-Gym's registered names (``nemo_gym/failure_kinds.py`` in nemo-gym 0.7.0) that this
# client does not produce itself but a server may send.
_SERVER_KINDS: Final = frozenset(
    {
        "transport_local_resource",
        "agent_command_not_allowed",
        "judge_failed",
        "judge_unparseable",
        "provider_unavailable",
        "provider_quota_exhausted",
        "provider_oom_killed",
        "session_lost",
        "session_expired",
        "session_release_failed",
        "kill_shaped",
        "shutdown",
        "persistence_failed",
        "cohort_incomplete",
    }
)
_KNOWN_KINDS: Final = _SERVER_KINDS | {
    TRANSPORT_UNREACHABLE,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TIMEOUT,
    TRANSPORT_TLS,
    AGENT_RUN_ERROR,
    AGENT_REQUEST_FAILED,
    AGENT_TIMEOUT,
    POLICY_TIMEOUT,
    CANCELLED,
    INVALID_REQUEST,
    INVALID_CONFIG,
    CLIENT_ERROR,
    SEED_FAILED,
    POLICY_FAILED,
    VERIFIER_ERROR,
}

# NeMo-Gym's name rule: ``<domain>_<condition>``, optionally namespaced ``<server>:<kind>``.
_NAME = re.compile(r"[a-z][a-z0-9_]*(?::[a-z][a-z0-9_]*)?")
_NAME_MAX_CHARS = 64


def _is_valid_name(kind: str) -> bool:
    """Whether ``kind`` is a short identifier fit for a record, a log line and a metric key."""
    return len(kind) <= _NAME_MAX_CHARS and _NAME.fullmatch(kind) is not None


def check_server_kind(kind: str) -> bool:
    """Whether a ``failure_kind`` sent by the server can be recorded as is.

    Like NeMo-Gym's ``validate_failure_kind``, an unregistered but well-formed name is
    kept (``agent.run`` warns about it once); anything else (long, multi-line, odd
    characters) is not.
    """
    return kind in _KNOWN_KINDS or _is_valid_name(kind)


def is_registered(kind: str) -> bool:
    """Whether ``kind`` is one of NeMo-Gym's kinds or this package's."""
    return kind in _KNOWN_KINDS


def metric_label(kind: str) -> str:
    """``kind`` as a metric/filter-reason suffix (``:`` is not safe in every backend).

    A name that is not a short identifier (a corrupted record) becomes ``unrecognized``
    rather than an unbounded metric key."""
    return kind.replace(":", "_") if _is_valid_name(kind) else "unrecognized"


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


# ----------------------------------------------------------------------------- what may be shown of a secret
REDACTED = "***"
"""What stands in for a hidden secret."""
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")

_MIN_SECRET_CHARS = 8
"""A shorter key (local servers often take ``EMPTY``) cannot be told apart from ordinary
text, so replacing it would rewrite words and numbers of the answer; it is treated as
non-secret (with one warning) instead."""


def redact_url(url: str) -> str:
    """``url`` with any password in its user-info replaced by ``***``; other text unchanged."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # unparseable (e.g. a bad port): hide the whole user-info
        return _USERINFO.sub(rf"\1{REDACTED}@", url)
    if password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}"))


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_urls(text: str) -> str:
    """``text`` (an error message that may quote a setting) with every URL's password hidden."""
    if "@" not in text:  # the common case, on the hot path of every failure reason
        return text
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)


def _hex(value: int, width: int) -> bytes:
    """``value`` in hex as a regex accepting either letter case."""
    return "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in f"{value:0{width}x}").encode()


def _char_forms(char: str) -> bytes:
    """A regex matching ``char`` as a server may echo it in JSON, URL or nested-JSON text:
    literal, after backslashes (``\\/``), ``\\uXXXX`` in either case, ``%XX``.

    Every alternative starts with a literal byte so the regex engine can skip ahead to
    candidates (a scrub runs on every answer)."""
    literal = re.escape(char.encode("utf-8"))
    escaped = [literal]
    code = ord(char)
    if code <= 0xFFFF:
        escaped.append(b"u" + _hex(code, 4))
    forms = [literal, b"\\\\\\\\*(?:" + b"|".join(escaped) + b")"]
    if code < 0x80:
        forms.append(b"%" + _hex(code, 2))
    return b"(?:" + b"|".join(forms) + b")"


_UNICODE_ESCAPE = re.compile(rb"\\u([0-9a-fA-F]{4})")
_PERCENT_ESCAPE = re.compile(rb"%([0-9a-fA-F]{2})")


class KeyScrubber:
    """Removes one secret, in every encoding a server may echo, from outside text."""

    def __init__(self, secret: str) -> None:
        self._plain = secret.encode("utf-8")
        self._pattern = re.compile(b"".join(_char_forms(char) for char in secret))
        self._codes = frozenset(ord(char) for char in secret)
        self._cut_bytes = frozenset(self._plain) | frozenset(b"\\%u0123456789abcdefABCDEF")
        """Every byte an encoding of the secret is made of."""

    def _has_escaped_char(self, raw: bytes) -> bool:
        """Whether one of the secret's characters appears as a \\uXXXX or %XX escape."""
        # Patterns with a literal prefix: the engine jumps between candidates at C speed
        # (an alternation of the escapes themselves would scan every position).
        for introducer, pattern in ((b"\\u", _UNICODE_ESCAPE), (b"%", _PERCENT_ESCAPE)):
            if introducer in raw and any(int(m.group(1), 16) in self._codes for m in pattern.finditer(raw)):
                return True
        return False

    def scrub(self, raw: bytes) -> bytes:
        """``raw`` with every encoding of the secret replaced by ``***``."""
        # The full pattern is the slow part. It can only match where the secret is spelled
        # out, maybe with backslashes in between (\/), or where one of its characters is
        # escaped as \uXXXX/%XX: both are checked first, far more cheaply.
        if self._plain not in raw.replace(b"\\", b"") and not self._has_escaped_char(raw):
            return raw
        return self._pattern.sub(REDACTED.encode(), raw)

    def scrub_cut(self, raw: bytes) -> bytes:
        """``scrub`` of text a cap cut off, also without the trailing bytes that could begin an
        encoding of the secret (a secret cut in two matches no pattern): at most as many as its
        longest encoding has (8 per character: ``\\\\u0073`` in JSON inside JSON)."""
        raw = self.scrub(raw)
        end, floor = len(raw), max(0, len(raw) - 8 * len(self._plain))
        while end > floor and raw[end - 1] in self._cut_bytes:
            end -= 1
        return raw[:end]

    def scrub_text(self, text: str) -> str:
        return self.scrub(text.encode("utf-8", "backslashreplace")).decode("utf-8", "replace")


@lru_cache(maxsize=8)
def key_scrubber(secret: str | None) -> KeyScrubber | None:
    """The scrubber for ``secret``, or None when there is nothing text redaction can protect."""
    if not secret:
        return None
    if len(secret) < _MIN_SECRET_CHARS:
        logger.warning(  # once per key: the scrubber is cached
            "NEMO_GYM_POLICY_API_KEY is shorter than %d characters: it is treated as non-secret "
            "and not redacted from server answers (use a real key if it must stay private)",
            _MIN_SECRET_CHARS,
        )
        return None
    return KeyScrubber(secret)


def scrub_all(secrets: Iterable[str | None]) -> Callable[[bytes], bytes]:
    """One function removing every one of ``secrets`` (each as ``key_scrubber`` protects it) from bytes."""
    scrubbers = [scrubber for scrubber in map(key_scrubber, secrets) if scrubber is not None]

    def scrub(data: bytes) -> bytes:
        for scrubber in scrubbers:
            data = scrubber.scrub(data)
        return data

    return scrub
