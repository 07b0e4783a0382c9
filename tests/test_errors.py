"""Every exception class the package defines derives from ``MilesNemoGymError``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import miles_nemogym
from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.runtime import current
from tests.support.runtime_settings import UseSettings


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


def test_each_error_is_caught_by_the_builtin_base_its_callers_catch(tmp_path: Path, use_settings: UseSettings) -> None:
    """Raised by the package's own functions, each error reaches an ``except`` on the builtin base
    callers wrote before the common base existed, and an ``except MilesNemoGymError`` as well."""
    from miles_nemogym import groups
    from miles_nemogym.data._convert import ConvertOptions, convert, convert_row

    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="soon")
    with pytest.raises(ValueError, match="invalid miles-nemogym configuration") as bad_setting:
        _ = current().settings
    use_settings(NEMO_GYM_OUTAGE_TIMEOUT="60", NEMO_GYM_MAX_FAILURE_STREAK="2")

    with pytest.raises(ValueError) as bad_row:
        convert_row({"instance_id": "x"})
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(RuntimeError, match="nothing written") as nothing_converted:
        convert(ConvertOptions(input=str(empty), output=tmp_path / "out.jsonl"))

    for _ in range(2):
        current().ledger.record_episode("transport_unreachable")
    with pytest.raises(RuntimeError, match="2 NeMo-Gym episodes in a row failed") as stopped:
        groups.check_run(current().settings)

    caught = [bad_setting.value, bad_row.value, nothing_converted.value, stopped.value]
    assert [type(error).__name__ for error in caught] == [
        "SettingsError",
        "RowInvalidError",
        "ConvertError",
        "RunStopped",
    ]
    assert all(isinstance(error, MilesNemoGymError) for error in caught)
    assert MilesNemoGymError.__bases__ == (Exception,)  # never a BaseException a bare except misses
