"""Convert SWE-bench-family and NeMo-Gym environment task rows into Miles prompt rows: the public Python API.

:func:`convert` with :class:`ConvertOptions` (whole files, streaming, every output file or none:
:class:`WriteError`, :class:`InterruptedAfterCommit`; ``environments`` for
NeMo-Gym environment rows, mixed and held out), :func:`convert_row` (one SWE-bench row),
:func:`to_environment_row` (one environment row), :func:`validate_instance` and :func:`to_prompt_row`
(the pure checks and mapping), :func:`open_source` (stream raw rows), :func:`load_grade_tables`
(what ``swebench`` can grade).
"""

from miles_nemogym.data.atomic import InterruptedAfterCommit, WriteError
from miles_nemogym.data.convert import (
    ConvertError,
    ConvertOptions,
    ConvertReport,
    RowInvalidError,
    RowProblem,
    convert,
    convert_row,
    encode_row,
)
from miles_nemogym.data.environments import EnvironmentInput, environment_of_row, to_environment_row
from miles_nemogym.data.gradeable import GradeTables, SwebenchMissingError, load_grade_tables
from miles_nemogym.data.rows import DatasetKind, Routing, infer_kind, resolve_routing, to_prompt_row
from miles_nemogym.data.schema import (
    REQUIRED_FIELDS,
    SUBSETS,
    FieldProblem,
    SweBenchInstance,
    validate_instance,
)
from miles_nemogym.data.select import Selection, read_instance_ids
from miles_nemogym.data.sources import RawRow, RowSource, SourceError, open_source

__all__ = [
    "REQUIRED_FIELDS",
    "SUBSETS",
    "ConvertError",
    "ConvertOptions",
    "ConvertReport",
    "DatasetKind",
    "EnvironmentInput",
    "FieldProblem",
    "GradeTables",
    "InterruptedAfterCommit",
    "RawRow",
    "Routing",
    "RowInvalidError",
    "RowProblem",
    "RowSource",
    "Selection",
    "SourceError",
    "SweBenchInstance",
    "SwebenchMissingError",
    "WriteError",
    "convert",
    "convert_row",
    "encode_row",
    "environment_of_row",
    "infer_kind",
    "load_grade_tables",
    "open_source",
    "read_instance_ids",
    "resolve_routing",
    "to_environment_row",
    "to_prompt_row",
    "validate_instance",
]
