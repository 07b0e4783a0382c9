"""The converter: SWE-bench and NeMo-Gym environment task rows -> Miles prompt rows (its Python API:
docs/commands.md, "From Python"), and the row readers, checks and atomic writes the other tools share."""

from miles_nemogym.data._atomic import AtomicFiles, InterruptedAfterCommit, WriteError, output_problem, write_file
from miles_nemogym.data._convert import ConvertError, ConvertOptions, ConvertReport, convert, convert_row, printable
from miles_nemogym.data._environments import environment_row, named_environment
from miles_nemogym.data._rows import prompt_row_problem
from miles_nemogym.data._schema import SUBSETS, decode_test_lists
from miles_nemogym.data._select import parse_instance_ids
from miles_nemogym.data._sources import SourceError, open_file

__all__ = [
    "SUBSETS",
    "AtomicFiles",
    "ConvertError",
    "ConvertOptions",
    "ConvertReport",
    "InterruptedAfterCommit",
    "SourceError",
    "WriteError",
    "convert",
    "convert_row",
    "decode_test_lists",
    "environment_row",
    "named_environment",
    "open_file",
    "output_problem",
    "parse_instance_ids",
    "printable",
    "prompt_row_problem",
    "write_file",
]
