"""``use_settings``: how a test gives the hooks their settings, without the process environment.

Requesting the fixture installs a ``Runtime`` with the default settings (none of the shell's
variables). ``use_settings(NEMO_GYM_URL=url, NEMO_GYM_RUN_TIMEOUT="5")`` then installs a fresh
``Runtime`` whose ``Settings`` are every variable given so far in the test, by the names users
export (a name the package does not read is refused), validated as ``Settings.from_env``
validates the environment; ``NAME=None`` unsets one given before. Nothing is read from or
written to ``os.environ``, so a variable of the shell that runs the tests never reaches a hook
test. Call it before the episodes it is for: each call starts a new ``Runtime`` (no ledger,
circuits or stores carried over).

Values the settings refuse install a runtime whose ``settings`` raise that ``SettingsError`` on
every use, as a runtime reading a bad environment does: what a hook test of bad settings needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import pytest

from miles_nemogym.errors import SettingsError
from miles_nemogym.runtime import Runtime, install
from miles_nemogym.settings import ENV_VARS, Settings

__all__ = ["UseSettings", "use_settings"]


class UseSettings(Protocol):
    """The type of the ``use_settings`` fixture."""

    def __call__(self, **variables: str | None) -> Runtime: ...


class _Unusable(Runtime):
    """A runtime whose variables are refused: ``settings`` raises their ``SettingsError`` on every
    use (``Runtime.settings`` with ``os.environ`` replaced by the given variables)."""

    def __init__(self, given: Mapping[str, str]) -> None:
        super().__init__()
        self._given = dict(given)

    @property
    def settings(self) -> Settings:
        return Settings.from_env(self._given)


@pytest.fixture
def use_settings() -> UseSettings:
    given: dict[str, str] = {}

    def use(**variables: str | None) -> Runtime:
        unknown = sorted(set(variables) - set(ENV_VARS))
        if unknown:
            raise TypeError(f"use_settings: not a variable the package reads: {', '.join(unknown)}")
        for name, value in variables.items():
            if value is None:
                given.pop(name, None)
            else:
                given[name] = value
        try:
            settings = Settings.from_env(given)
        except SettingsError:
            return install(_Unusable(given))
        return install(Runtime(settings))

    use()
    return use
