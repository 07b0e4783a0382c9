"""The rollout id of an agent ``/run``: the sample's policy URL (Miles' session URL + ``/v1``) as
unpadded base64url, which fits NeMo-Gym's rollout-id alphabet (``[A-Za-z0-9._-]``) and always
starts with a letter (``aHR0c`` is ``http``). Standard library only: the trainer imports it, and
the routing model runs it in the server venv, where this package is not installed."""

from __future__ import annotations

import base64
import binascii
import re

__all__ = ["policy_url_of", "rollout_id"]

_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")
MAX_ID_CHARS = 2048


def rollout_id(policy_url: str) -> str:
    """The rollout id that routes a ``/run``'s model calls to ``policy_url``."""
    return base64.urlsafe_b64encode(policy_url.encode("utf-8")).decode("ascii").rstrip("=")


def policy_url_of(rollout: str) -> str | None:
    """The policy URL a rollout id encodes, or None when it encodes none."""
    if not rollout or len(rollout) > MAX_ID_CHARS or not _ALPHABET.fullmatch(rollout):
        return None
    try:
        return base64.urlsafe_b64decode(rollout + "=" * (-len(rollout) % 4)).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
