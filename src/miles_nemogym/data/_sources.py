"""The one row reader (convert, scan, the launcher's data check): task rows one at a time from a
dataset id, a folder, or a JSONL/JSON/parquet file, streaming (docs/data-and-checks.md)."""

from __future__ import annotations

import codecs
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_nemogym.errors import MilesNemoGymError

__all__ = ["SourceError", "open_file"]

_PARQUET_BATCH_ROWS = 64  # as fast as larger batches, with a lower peak RSS (bench/README.md, "Converter")
_JSON_CHUNK = 1 << 20
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_LOCAL_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet")


class SourceError(MilesNemoGymError, RuntimeError):
    """The input cannot be read at all (not a per-row problem)."""


@dataclass(frozen=True)
class RawRow:
    """One input row: ``data`` when it decoded to a JSON object, else ``error``."""

    index: int
    line: int | None
    data: dict[str, Any] | None
    error: str | None = None

    def where(self) -> str:
        return f"row {self.index + 1}" + (f" (line {self.line})" if self.line is not None else "")

    def location(self, name: str) -> str:
        """``<name>:<line>`` (text files) or ``<name> row <n>``, for messages that lead with the file."""
        return f"{name}:{self.line}" if self.line is not None else f"{name} row {self.index + 1}"


@dataclass(frozen=True)
class RowSource:
    """An input opened for streaming. ``total`` is the row count when known cheaply."""

    name: str
    kind: str
    total: int | None
    rows: Generator[RawRow, None, None]

    def __iter__(self) -> Iterator[RawRow]:
        return self.rows


def _decoded_row(index: int, line: int | None, value: Any) -> RawRow:
    if isinstance(value, dict):
        return RawRow(index, line, value)
    return RawRow(index, line, None, f"not a JSON object (got {type(value).__name__})")


def _jsonl_rows(path: Path) -> Generator[RawRow, None, None]:
    index = 0
    with path.open("rb") as handle:
        for line_number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
                yield RawRow(index, line_number, None, f"not valid JSON: {error}")
            except RecursionError:
                yield RawRow(index, line_number, None, "not readable: JSON nested too deeply")
            else:
                yield _decoded_row(index, line_number, value)
            index += 1


def _json_rows(path: Path) -> Generator[RawRow, None, None]:
    """A JSON array or sequence of values, by ``raw_decode`` over a window of the file that grows while a
    value does not fit in it."""
    decoder, utf8 = json.JSONDecoder(), codecs.getincrementaldecoder("utf-8-sig")()
    text, pos, wanted, eof, index = "", 0, 0, False, 0
    state = "start"  # then "array", "values" (a sequence of them) or "closed" (past the array's ']')
    with path.open("rb") as handle:
        while True:
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
            if pos == len(text) or wanted:
                if eof:
                    break
                raw = handle.read(max(wanted, _JSON_CHUNK))
                eof, wanted = not raw, 0
                try:
                    text, pos = text[pos:] + utf8.decode(raw, final=eof), 0
                except UnicodeDecodeError as error:
                    raise SourceError(f"{path}: not UTF-8 text ({error.reason})") from None
                continue
            if state == "closed":
                raise SourceError(f"{path}: unexpected data after the closing ']' of the JSON array")
            if state == "start":
                state = "array" if text[pos] == "[" else "values"
                pos += state == "array"
            elif state == "array" and text[pos] in "],":
                state = "closed" if text[pos] == "]" else state
                pos += 1
            else:
                try:
                    value, pos = decoder.raw_decode(text, pos)
                except RecursionError:
                    raise SourceError(
                        f"{path}: row {index + 1} is JSON nested too deeply to read; nothing past it can be read — "
                        "fix the file or export it as JSONL (one object per line), where a bad row is skipped"
                    ) from None
                except json.JSONDecodeError as error:
                    if eof:
                        raise SourceError(
                            f"{path}: not valid JSON after {index} rows ({error.msg}); nothing past that "
                            "point can be read — fix the file or export it as JSONL (one object per line)"
                        ) from None
                    wanted = 2 * len(text)
                    continue
                yield _decoded_row(index, None, value)
                index += 1
    if state == "array":
        raise SourceError(f"{path}: the JSON array is not closed (file truncated?)")


def _parquet_source(path: Path) -> RowSource:
    import pyarrow.parquet as pq

    try:
        # Unbuffered, threadless reads keep memory at about one row group (pre_buffer grew with the file).
        parquet = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
    except Exception as error:
        raise SourceError(f"{path}: not a readable parquet file ({error})") from None

    def values() -> Iterator[Any]:
        with parquet:
            for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, use_threads=False):
                yield from batch.to_pylist()

    rows = _guarded(values(), lambda index, error: f"{path}: unreadable after {index} rows ({error})")
    return RowSource(str(path), "parquet", parquet.metadata.num_rows, rows)


def _guarded(values: Iterator[Any], failed: Callable[[int, Exception], str]) -> Generator[RawRow, None, None]:
    """``values`` as rows; a reader's error after ``index`` rows as a :class:`SourceError`."""
    index = 0
    try:
        for value in values:
            yield RawRow(index, None, dict(value))
            index += 1
    except Exception as error:  # the readers raise many kinds (casting, network, files)
        raise SourceError(failed(index, error)) from None


_HUB_HINT = "; without access to the hub, download it elsewhere and pass the folder or a parquet/JSONL file"


def _hub_unreachable() -> str | None:
    """Why the dataset hub (``$HF_ENDPOINT``) cannot be reached, or None when it answers (asked first:
    ``datasets`` retries an unreachable hub for half a minute before failing the same way)."""
    if any(os.environ.get(name, "") not in ("", "0") for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return None  # offline mode reads the local cache only
    endpoint = os.environ.get("HF_ENDPOINT", "").strip() or "https://huggingface.co"
    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=5.0):
            return None
    except urllib.error.HTTPError:
        return None  # any HTTP answer: the hub is there
    except OSError as error:  # URLError is one
        return f"{endpoint} does not answer: {getattr(error, 'reason', error)}"


def _datasets_source(spec: str, split: str, *, local: bool) -> RowSource:
    if not local:
        problem = _hub_unreachable()
        if problem is not None:
            raise SourceError(f"{spec}: cannot load it from the dataset hub ({problem}){_HUB_HINT}")
    import datasets

    try:
        dataset = datasets.load_dataset(spec, split=split, streaming=True)
    except ValueError as error:
        if "split" in str(error).lower():
            raise SourceError(f"{spec}: no split {split!r} ({error}); pass --split with one of them") from None
        raise SourceError(f"{spec}: cannot load it with datasets.load_dataset ({error})") from None
    except Exception as error:
        where = "the folder" if local else "the dataset hub"
        hint = "" if local else _HUB_HINT
        raise SourceError(f"{spec}: cannot load it from {where} ({type(error).__name__}: {error}){hint}") from None
    splits = getattr(getattr(dataset, "info", None), "splits", None) or {}
    total = int(splits[split].num_examples) if split in splits and splits[split].num_examples else None
    rows = _guarded(
        iter(dataset),
        lambda index, error: f"{spec}: reading failed after {index} rows ({type(error).__name__}: {error})",
    )
    return RowSource(spec, "folder" if local else "hub", total, rows)


def open_file(path: Path) -> RowSource:
    """Open one local JSONL/JSON/parquet file for streaming (the scan and the launcher read only files)."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return RowSource(str(path), "jsonl", None, _jsonl_rows(path))
    if suffix == ".json":
        return RowSource(str(path), "json", None, _json_rows(path))
    if suffix == ".parquet":
        return _parquet_source(path)
    raise SourceError(
        f"{path}: unsupported file type {suffix or '(none)'!r}; use "
        f"{', '.join(_LOCAL_SUFFIXES)}, a folder of them, or a dataset id"
    )


def open_source(spec: str, split: str) -> RowSource:
    """Open ``spec`` for streaming; ``split`` is used for folders and hub ids only."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return _datasets_source(str(path), split, local=True)
    if path.is_file():
        return open_file(path)
    if path.suffix.lower() in _LOCAL_SUFFIXES or spec.startswith((".", "/", "~")) or not _HUB_ID.match(spec):
        raise SourceError(f"{spec}: no such file or folder")
    return _datasets_source(spec, split, local=False)
