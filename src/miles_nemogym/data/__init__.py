"""The converter: SWE-bench and NeMo-Gym environment task rows -> Miles prompt rows (its Python API:
docs/commands.md, "From Python"), and the row readers, checks and atomic writes the other tools share."""

from miles_nemogym.data._atomic import AtomicFiles, InterruptedAfterCommit, WriteError, output_problem, write_file
from miles_nemogym.data._convert import ConvertError, ConvertOptions, ConvertReport, convert, convert_row, printable
from miles_nemogym.data._environments import environment_of_row, is_environment_row, task_key, to_environment_row
from miles_nemogym.data._rows import prompt_row_problem
from miles_nemogym.data._schema import SUBSETS, TEST_LIST_FIELDS, decode_test_list
from miles_nemogym.data._select import parse_instance_ids
from miles_nemogym.data._sources import SourceError, open_file

__all__ = [
    "SUBSETS",
    "TEST_LIST_FIELDS",
    "AtomicFiles",
    "ConvertError",
    "ConvertOptions",
    "ConvertReport",
    "InterruptedAfterCommit",
    "SourceError",
    "WriteError",
    "convert",
    "convert_row",
    "decode_test_list",
    "environment_of_row",
    "is_environment_row",
    "open_file",
    "output_problem",
    "parse_instance_ids",
    "printable",
    "prompt_row_problem",
    "task_key",
    "to_environment_row",
    "write_file",
]
