"""The one base of every exception miles-nemogym defines."""

from __future__ import annotations


class MilesNemoGymError(Exception):
    """Raised on purpose by miles-nemogym; each subclass keeps its builtin base too (``ValueError``, ...)."""
