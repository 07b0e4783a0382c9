"""Every exception class the package defines derives from ``MilesNemoGymError``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import miles_nemogym
from miles_nemogym.errors import MilesNemoGymError


def _package_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(miles_nemogym.__path__, prefix="miles_nemogym."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                found[f"{info.name}.{name}"] = value
    return found


def test_every_package_exception_derives_from_the_one_base() -> None:
    exceptions = _package_exceptions()
    assert len(exceptions) >= 24  # the walk really found the package's classes
    assert [name for name, cls in exceptions.items() if not issubclass(cls, MilesNemoGymError)] == []


def test_the_builtin_bases_callers_catch_are_kept() -> None:
    from miles_nemogym.data.convert import ConvertError, RowInvalidError
    from miles_nemogym.errors import RunStopped
    from miles_nemogym.settings import SettingsError

    assert issubclass(SettingsError, ValueError)
    assert issubclass(RowInvalidError, ValueError)
    assert issubclass(ConvertError, RuntimeError)
    assert issubclass(RunStopped, RuntimeError)
    assert MilesNemoGymError.__bases__ == (Exception,)
