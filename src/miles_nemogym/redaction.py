"""What may be shown of a secret: URLs with their password hidden.

Every URL the package prints, logs or records goes through ``redact_url`` so that
credentials written into ``NEMO_GYM_URL`` or a session URL never reach a log or a file.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


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
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)
