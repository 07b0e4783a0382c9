"""The converter: SWE-bench and NeMo-Gym environment task rows -> Miles prompt rows (its Python API:
docs/commands.md, "From Python"), and the row readers, checks and atomic writes the other tools share.
Its errors are ``MilesNemoGymError`` subclasses; a file that cannot be written raises an ``OSError``."""

from miles_nemogym.data._atomic import InterruptedAfterCommit, output_problem, write_file
from miles_nemogym.data._convert import ConvertError, ConvertOptions, ConvertReport, convert, convert_row, printable
from miles_nemogym.data._environments import named_environment
from miles_nemogym.data._rows import prompt_row_problem
from miles_nemogym.data._schema import SUBSETS, decode_test_lists
from miles_nemogym.data._select import parse_instance_ids
from miles_nemogym.data._sources import open_file

__all__ = [
    "SUBSETS",
    "ConvertError",
    "ConvertOptions",
    "ConvertReport",
    "InterruptedAfterCommit",
    "convert",
    "convert_row",
    "decode_test_lists",
    "named_environment",
    "open_file",
    "output_problem",
    "parse_instance_ids",
    "printable",
    "prompt_row_problem",
    "write_file",
]
