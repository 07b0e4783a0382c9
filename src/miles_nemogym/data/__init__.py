"""The converter's Python API: SWE-bench and NeMo-Gym environment task rows -> Miles prompt rows
(docs/commands.md, "From Python")."""

from miles_nemogym.data.atomic import InterruptedAfterCommit, WriteError
from miles_nemogym.data.convert import (
    ConvertError,
    ConvertOptions,
    ConvertReport,
    RowInvalidError,
    convert,
    convert_row,
)
from miles_nemogym.data.environments import EnvironmentInput, to_environment_row
from miles_nemogym.data.schema import FieldProblem, SweBenchInstance, validate_instance
from miles_nemogym.data.select import SwebenchMissingError
from miles_nemogym.data.sources import SourceError

__all__ = [
    "ConvertError",
    "ConvertOptions",
    "ConvertReport",
    "EnvironmentInput",
    "FieldProblem",
    "InterruptedAfterCommit",
    "RowInvalidError",
    "SourceError",
    "SweBenchInstance",
    "SwebenchMissingError",
    "WriteError",
    "convert",
    "convert_row",
    "to_environment_row",
    "validate_instance",
]
