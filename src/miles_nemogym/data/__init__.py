"""The converter: SWE-bench and NeMo-Gym environment task rows -> Miles prompt rows (its Python API:
docs/commands.md, "From Python"), and the row readers, checks and atomic writes the other tools share."""

from miles_nemogym.data._atomic import AtomicFiles, InterruptedAfterCommit, WriteError, output_problem, write_file
from miles_nemogym.data._convert import (
    ConvertError,
    ConvertOptions,
    ConvertReport,
    RowInvalidError,
    convert,
    convert_row,
    printable,
    summary_notes,
)
from miles_nemogym.data._environments import (
    EnvironmentInput,
    chat_prompt,
    environment_of_row,
    is_environment_row,
    parse_env_option,
    task_key,
    to_environment_row,
)
from miles_nemogym.data._schema import (
    SUBSETS,
    TEST_LIST_FIELDS,
    FieldProblem,
    SweBenchInstance,
    decode_test_list,
    validate_instance,
)
from miles_nemogym.data._select import SwebenchMissingError, instance_ids_option, parse_instance_ids
from miles_nemogym.data._sources import SourceError, open_file

__all__ = [
    "SUBSETS",
    "TEST_LIST_FIELDS",
    "AtomicFiles",
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
    "chat_prompt",
    "convert",
    "convert_row",
    "decode_test_list",
    "environment_of_row",
    "instance_ids_option",
    "is_environment_row",
    "open_file",
    "output_problem",
    "parse_env_option",
    "parse_instance_ids",
    "printable",
    "summary_notes",
    "task_key",
    "to_environment_row",
    "validate_instance",
    "write_file",
]
