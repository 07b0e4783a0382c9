"""What the trainer and the routing model share, standard library only: the trainer imports it and
the routing model runs it in the server venv, where this package is not installed.

**The rollout id** of an agent ``/run``: the sample's policy URL (Miles' session URL + ``/v1``) as
unpadded base64url, a dot, and its HMAC-SHA256 under the secret ``serve`` makes for its routing
model (``NEMO_GYM_ROLLOUT_SECRET``), also base64url. It fits NeMo-Gym's rollout-id alphabet
(``[A-Za-z0-9._-]``, first a letter: ``aHR0c`` is ``http``); only the trainer, holding the secret,
issues ids the routing model accepts.

**A session's HTTP error answer**, one rule on both paths (the in-process loop,
``episode/environment.py``, and the routing model, ``app.py``): a 400 whose body says "context
length" (vLLM's "maximum context length", SGLang's "longer than the model's context length") is the
conversation outgrowing the context, a cut-off answered as NeMo-Gym's ``vllm_model`` answers it (an
empty turn, ``finish_reason: length``). Every other error answer, a 400 saying "max_tokens must be
..." included, fails the episode.
"""

from __future__ import annotations

import base64
import binascii
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
_DOMAIN = b"miles-nemogym rollout id v1\x00"
"""Signed with the URL, so a MAC made for anything else never passes as a rollout id's."""


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
    except (binascii.Error, ValueError):
        return None
    if not hmac.compare_digest(mac, _mac(secret, raw)):
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


# ----------------------------------------------------------------------------- a session's error answer

CONTEXT_FULL = re.compile(rb"context length", re.IGNORECASE)
"""What a 400's body says when the prompt leaves no room to generate (the in-process loop reads it
directly: a constant costs its sample path no file)."""


def is_context_overflow(status: int, body: bytes) -> bool:
    """Whether a session's answer ``status``/``body`` says the prompt leaves no room to generate."""
    return status == 400 and CONTEXT_FULL.search(body) is not None
