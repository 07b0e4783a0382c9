"""``clean_env``: none of the package's variables set, nor the launcher's cluster ones, as on a
fresh machine, so a value from the shell that runs the tests never leaks into one."""

from __future__ import annotations

import os

import pytest

from miles_nemogym.launcher._checks import LEGACY_ROLLOUT_ENV
from miles_nemogym.settings import ENV_VARS

__all__ = ["UNSET", "clean_env", "clean_environ"]

UNSET: tuple[str, ...] = (*ENV_VARS, "RAY_ADDRESS", "MASTER_ADDR", LEGACY_ROLLOUT_ENV)
"""Every ``NEMO_GYM_*``/``MILES_*`` variable the package reads, Ray's and torch's cluster address,
and Miles' legacy-rollout switch."""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset every variable in ``UNSET`` for the test."""
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)


def clean_environ(**variables: str) -> dict[str, str]:
    """This process's environment without any variable in ``UNSET``, plus ``variables``: the ``env=``
    of a test's subprocess that reads the package's variables as a user's process does."""
    return {**{name: value for name, value in os.environ.items() if name not in UNSET}, **variables}
