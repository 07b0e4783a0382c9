"""What may be shown of a secret: URLs with their password hidden, server text without the API key.

``redact_url`` / ``redact_urls`` hide URL passwords wherever a URL is printed, logged or
recorded. ``KeyScrubber`` removes the policy API key, in every encoding a server may echo
it, from outside text before anything parses, quotes or cuts it (docs/episode-pipeline.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from urllib.parse import urlsplit, urlunsplit

__all__ = ["REDACTED", "KeyScrubber", "redact_url", "redact_urls", "scrub_all"]

logger = logging.getLogger(__name__)

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
