"""Golden and API-policy scans: check a NeMo-Gym server before any GPU time is spent."""

from miles_nemogym.scan._entry import execute

__all__ = ["execute"]
