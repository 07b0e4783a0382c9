"""The sessions a ``RecordingPolicy`` was asked in, read from what it recorded."""

from __future__ import annotations

from miles_nemogym.smoke import RecordingPolicy


def asked_sessions(policy: RecordingPolicy) -> list[str]:
    """Each session id the policy received a request for, once, in order of its first request."""
    return list(dict.fromkeys(r.session_id for r in policy.requests() if r.session_id is not None))
