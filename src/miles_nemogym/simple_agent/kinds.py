"""Failure kinds of this loop that ``failure_kinds.py`` does not name yet.

Namespaced ``miles_nemogym:<kind>`` as NeMo-Gym asks for client-side extensions. A
``/verify`` that fails or answers garbage is NeMo-Gym's own ``verifier_error``.
"""

from __future__ import annotations

from typing import Final

SEED_FAILED: Final = "miles_nemogym:seed_failed"
"""``POST /seed_session`` answered an error or a body that is not JSON."""
POLICY_FAILED: Final = "miles_nemogym:policy_failed"
"""The policy's chat-completions endpoint (Miles' session URL) answered an error or garbage."""
VERIFIER_ERROR: Final = "verifier_error"
"""NeMo-Gym's name: ``/verify`` answered an error or a body without a finite ``reward``."""

ALL: Final = frozenset({SEED_FAILED, POLICY_FAILED, VERIFIER_ERROR})
