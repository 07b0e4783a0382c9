"""The one reader of a YAML file that must hold a mapping (launcher recipe, ``serve --provider-config``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miles_nemogym.errors import MilesNemoGymError

__all__ = ["YamlFileError", "load", "read_mapping"]


class YamlFileError(MilesNemoGymError, ValueError):
    """The file cannot be used; the message names the flag, the file and the fix."""


def read_mapping(path: Path, flag: str, *, utf8_fix: str, expected: str) -> dict[str, Any]:
    """The mapping in ``path`` (``{}`` for an empty file); ``expected`` describes it for the error."""
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml ships with the [cli] extra
        raise YamlFileError(f"{flag} needs PyYAML: pip install -e '.[cli]' in the miles-nemogym clone") from None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise YamlFileError(f"{flag} {path}: cannot read it ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise YamlFileError(f"{flag} {path}: not UTF-8 text (a binary file, or saved as UTF-16?); {utf8_fix}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise YamlFileError(f"{flag} {path}: not valid YAML ({error})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise YamlFileError(f"{flag} {path}: expected {expected}, got {type(data).__name__}")
    return data


def load(data: str | bytes) -> Any:
    """``yaml.safe_load`` through libyaml when PyYAML has it (the wheel's configs: ~10x faster)."""
    import yaml

    return yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
