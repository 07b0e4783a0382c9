"""What the trainer and the routing model share, standard library only (the routing model runs in the
server venv, where this package is not installed): the rollout id of an agent ``/run`` (the sample's
policy URL, unpadded base64url, ``.``, its HMAC-SHA256 under ``NEMO_GYM_ROLLOUT_SECRET``; only the
trainer issues ids the routing model accepts), and the one rule for a session's error answer on both
paths: a 400 saying "context length" is a cut-off (an empty ``length`` turn), any other fails the
episode. Why: docs/environments.md ("Routed agents").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

__all__ = [
    "CONTEXT_FULL",
    "MIN_SECRET_CHARS",
    "SECRET_VARIABLE",
    "is_context_overflow",
    "policy_url_of",
    "rollout_id",
    "secret_problem",
]

SECRET_VARIABLE = "NEMO_GYM_ROLLOUT_SECRET"
MIN_SECRET_CHARS = 32
MAX_ID_CHARS = 2048
_PART = re.compile(r"[A-Za-z0-9_-]+")
_DOMAIN = b"miles-nemogym rollout id v1\x00"  # signed with the URL: no other MAC passes as a rollout id's


def secret_problem(secret: str | None) -> str | None:
    """Why ``secret`` cannot sign rollout ids, or None."""
    if not secret or not secret.strip():
        return f"{SECRET_VARIABLE} is not set"
    if len(secret.strip()) < MIN_SECRET_CHARS:
        return f"{SECRET_VARIABLE} is shorter than {MIN_SECRET_CHARS} characters"
    return None


def _mac(secret: str, payload: bytes) -> str:
    digest = hmac.new(secret.strip().encode("utf-8"), _DOMAIN + payload, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def rollout_id(policy_url: str, secret: str) -> str:
    """The rollout id that routes a ``/run``'s model calls to ``policy_url``, signed with ``secret``."""
    problem = secret_problem(secret)
    if problem:
        raise ValueError(problem)
    raw = policy_url.encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=") + "." + _mac(secret, raw)


def policy_url_of(rollout: str, secret: str) -> str | None:
    """The policy URL a rollout id signed with ``secret`` names, or None (unsigned, forged, garbled)."""
    if secret_problem(secret) or not rollout or len(rollout) > MAX_ID_CHARS:
        return None
    encoded, dot, mac = rollout.partition(".")
    if not dot or not _PART.fullmatch(encoded) or not _PART.fullmatch(mac):
        return None
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        url = raw.decode("utf-8")
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
        return None
    return url if hmac.compare_digest(mac, _mac(secret, raw)) else None


# ----------------------------------------------------------------------------- a session's error answer

# A 400's body when the prompt leaves no room to generate (the in-process loop reads it directly).
CONTEXT_FULL = re.compile(rb"context length", re.IGNORECASE)


def is_context_overflow(status: int, body: bytes) -> bool:
    """Whether a session's answer ``status``/``body`` says the prompt leaves no room to generate."""
    return status == 400 and CONTEXT_FULL.search(body) is not None
