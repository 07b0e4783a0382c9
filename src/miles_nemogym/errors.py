"""The failure vocabulary: the exceptions miles-nemogym raises on purpose (each derives from
``MilesNemoGymError`` and keeps its builtin base; ``Failed``, ``SettingsError`` and ``RequestError``
become an episode's failure kind), the failure kinds recorded on a sample (NeMo-Gym's names, not
imported, plus ``miles_nemogym:<kind>`` for what it has no name for: docs/using-with-miles.md), a
pydantic ``ValidationError`` as one message (``describe``), and a failure's words, which never show a
secret (``redact_url(s)``; ``KeyScrubber``: docs/episode-pipeline.md, "Redaction").
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache, partial
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
    """The run cannot go on (an outage, a failure streak): the one exception meant to leave a hook."""


class Failed(MilesNemoGymError):
    """A step of an episode failed under failure kind ``kind``: one failure type from transport to record."""

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
        self.resendable = resendable  # it certainly never reached the server, within its deadline: may be re-sent
        self.policy = policy  # an agent_timeout while the policy held the episode (the timeout is the policy's)
        self.aborted = aborted  # Miles aborted the policy's generation (our abort, never a server's verdict)
        self.answered = False  # the server's answer had begun (status and headers), so a timeout is the server's
        self.os_error = os_error  # what the operating system said, for callers that explain a failure (doctor)


# ----------------------------------------------------------------------------- failure kinds
# When each is recorded: docs/using-with-miles.md (the failure_kind table).

TRANSPORT_UNREACHABLE: Final = "transport_unreachable"  # never reached the server: certainly not delivered
TRANSPORT_PEER_DROP: Final = "transport_peer_drop"  # the connection broke after the request may have arrived
TRANSPORT_TIMEOUT: Final = "transport_timeout"  # connecting outlasted the connect timeout
TRANSPORT_TLS: Final = "miles_nemogym:transport_tls"  # the TLS handshake failed: never sent until it is fixed
AGENT_RUN_ERROR: Final = "agent_run_error"  # the server answered and the episode broke (5xx, {error, traceback})
AGENT_REQUEST_FAILED: Final = "agent_request_failed"  # something answered but the episode never ran (4xx)
AGENT_TIMEOUT: Final = "agent_timeout"  # the try's deadline (NEMO_GYM_RUN_TIMEOUT) passed while waiting
# The deadline passed while the policy held the episode: a status on a valid record (NEMO_GYM_TIMEOUT_REWARD).
POLICY_TIMEOUT: Final = "miles_nemogym:policy_timeout"
CANCELLED: Final = "cancelled"  # abort() stopped the episode (Miles' over-sampling abort)
INVALID_REQUEST: Final = "miles_nemogym:invalid_request"  # before any request: the row or sampling keys
INVALID_CONFIG: Final = "miles_nemogym:invalid_config"  # before any request: an environment variable
CLIENT_ERROR: Final = "miles_nemogym:client_error"  # a defect in this plugin (logged with its traceback)
SEED_FAILED: Final = "miles_nemogym:seed_failed"  # POST /seed_session answered an error or no JSON object
POLICY_FAILED: Final = "miles_nemogym:policy_failed"  # the policy's chat completions answered an error or garbage
# NeMo-Gym's: /verify answered an error, no finite reward, or one outside the reward range (a server may send it).
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


def check_server_kind(kind: str) -> bool:
    """Whether a server's ``failure_kind`` is recorded as is: a short identifier fit for a record, a log
    line and a metric key (NeMo-Gym's rule; every registered kind follows it)."""
    return len(kind) <= _NAME_MAX_CHARS and _NAME.fullmatch(kind) is not None


def is_registered(kind: str) -> bool:
    """Whether ``kind`` is one of NeMo-Gym's kinds or this package's."""
    return kind in _KNOWN_KINDS


def metric_label(kind: str) -> str:
    """``kind`` as a metric/filter-reason suffix (no ``:``); ``unrecognized`` for a malformed one."""
    return kind.replace(":", "_") if check_server_kind(kind) else "unrecognized"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` agreeing in number: ``1 server``, ``2 servers``, ``counted(2, "match", "matches")``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


Loc = Sequence[int | str]
Label = Callable[[Loc], str]


def _dotted(prefix: str, loc: Loc) -> str:
    """A field's dotted path, under ``prefix`` when given (``metadata.repo``)."""
    return ".".join(str(part) for part in ([prefix] if prefix else []) + list(loc))


def message(item: ErrorDetails, *, unknown_key: str | None = None) -> str:
    """Pydantic's text for one field without "Value error, "; ``unknown_key`` for a key the model forbids."""
    if unknown_key is not None and item["type"] == "extra_forbidden":
        return unknown_key
    return str(item["msg"]).removeprefix("Value error, ")


def problems(error: ValidationError, label: Label | None = None, *, unknown_key: str | None = None) -> list[str]:
    """One ``<field>: <problem>`` line per error (just ``<problem>`` when the field has no name)."""
    name = label or partial(_dotted, "")
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
    return separator.join(problems(error, label or partial(_dotted, prefix), unknown_key=unknown_key))


# ----------------------------------------------------------------------------- what may be shown of a secret
REDACTED = "***"  # what stands in for a hidden secret
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")

# A shorter key (local servers often take ``EMPTY``) cannot be told apart from ordinary text: not redacted.
_MIN_SECRET_CHARS = 8


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
    """A regex matching ``char`` as a server may echo it: literal, after backslashes (``\\/``), ``\\uXXXX``
    in either case, ``%XX``; each alternative starts with a literal byte, so the engine skips ahead."""
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
        self._cut_bytes = frozenset(self._plain) | frozenset(b"\\%u0123456789abcdefABCDEF")  # of any encoding

    def _has_escaped_char(self, raw: bytes) -> bool:
        """Whether one of the secret's characters appears as a \\uXXXX or %XX escape (literal-prefix patterns: fast)."""
        for introducer, pattern in ((b"\\u", _UNICODE_ESCAPE), (b"%", _PERCENT_ESCAPE)):
            if introducer in raw and any(int(m.group(1), 16) in self._codes for m in pattern.finditer(raw)):
                return True
        return False

    def scrub(self, raw: bytes) -> bytes:
        """``raw`` with every encoding of the secret replaced by ``***``."""
        # The full pattern (slow) can only match where the secret is spelled out, maybe with
        # backslashes in between (\/), or one of its characters is escaped: both checked first, cheaply.
        if self._plain not in raw.replace(b"\\", b"") and not self._has_escaped_char(raw):
            return raw
        return self._pattern.sub(REDACTED.encode(), raw)

    def scrub_cut(self, raw: bytes) -> bytes:
        """``scrub`` of text a cap cut off, without the trailing bytes that could begin an encoding of
        the secret: at most its longest encoding's (8 per character: ``\\\\u0073`` in JSON inside JSON)."""
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
