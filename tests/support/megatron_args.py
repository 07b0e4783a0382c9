"""Miles' own argument parsing of given ``train.py`` argvs: runs INSIDE the Miles venv with
Megatron-LM on ``PYTHONPATH`` (``tests.support.miles_env.ensure_megatron_env``).

Started by ``tests.support.miles_harness.parse_with_miles`` (never imported by the tests). It
reads one JSON request on stdin: ``checkpoint`` (a folder to make: the offline Qwen3 tokenizer
plus a ``config.json`` with ``config`` over Qwen3's), ``tokenizer_cache``, ``report`` (argument
names to send back) and ``cases`` (``name``, ``script`` = ``train.py`` or ``train_async.py``,
``argv`` = its arguments, ``env``). For each case it runs ``miles.utils.arguments.parse_args``
under that argv and environment: Miles' parser with Megatron's, ``miles_validate_args``, then
Megatron's ``validate_args``, as ``train.py`` does before any GPU work; for ``train_async.py``
also the two checks its ``train`` makes first (no ``--colocate``, Miles'
``validate_async_off_policy_correction``). It answers one JSON line: per case ``ok``, ``error``
(argparse's message or the exception) and the reported values. What Miles and Megatron print
goes to stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

_REPLY = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)

_started = time.monotonic()
import megatron.training.arguments as megatron_arguments  # noqa: E402
import megatron.training.utils as megatron_utils  # noqa: E402
from miles.utils.arguments import parse_args, validate_async_off_policy_correction  # noqa: E402
from miles.utils.chat_template_utils.tito_tokenizer import TITOTokenizerType  # noqa: E402
from sglang.srt.function_call.function_call_parser import FunctionCallParser  # noqa: E402

from tests.support.qwen3_tokenizer import QWEN3_CONFIG, TOKENIZER_FORMAT, build_qwen3_tokenizer  # noqa: E402

_IMPORT_S = time.monotonic() - _started
HOPPER = 9


@contextlib.contextmanager
def _hopper() -> Iterator[None]:
    """The one seam: ``get_device_arch_version`` is the only CUDA query in Megatron's
    ``validate_args`` (at the pinned commit); it answers 9, a Hopper GPU. It is patched where
    it is defined and where ``megatron.training.arguments`` imported it by name."""
    with (
        patch.object(megatron_utils, "get_device_arch_version", lambda: HOPPER),
        patch.object(megatron_arguments, "get_device_arch_version", lambda: HOPPER),
    ):
        yield


class _NotInThisSGLang:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a tool-call parser name registered for Miles' argument check only")


def _register_miles_tool_call_parsers() -> list[str]:
    """The second difference from a GPU node, in what SGLang accepts rather than in a query:
    Miles' images install SGLang from its ``sglang-miles`` branch, this venv PyPI's release.
    The tool-call parser names Miles' own TITO families bind (``--tito-model``) that this
    SGLang lacks are registered as names only (a parser is never built here); returned, so
    the test names them."""
    known = FunctionCallParser.ToolCallParserEnum
    bound = {TITOTokenizerType.get_tokenizer_class(kind).tool_call_parser for kind in TITOTokenizerType}
    added = sorted(name for name in bound if name and name not in known)
    for name in added:
        known[name] = _NotInThisSGLang  # type: ignore[assignment]
    return added


def _bound_parsers(tito_model: str) -> list[str | None]:
    """The SGLang reasoning and tool-call parsers Miles binds to a ``--tito-model`` family."""
    family = TITOTokenizerType.get_tokenizer_class(TITOTokenizerType(tito_model))
    return [family.reasoning_parser, family.tool_call_parser]


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _checkpoint(folder: Path, cache: Path, config: dict[str, Any]) -> None:
    """The offline Qwen3 tokenizer's files, with ``config`` over its ``config.json`` (no weights)."""
    tokenizer = build_qwen3_tokenizer(cache / f"qwen3-tokenizer-v{TOKENIZER_FORMAT}")
    folder.mkdir(parents=True, exist_ok=True)
    for path in tokenizer.iterdir():
        if path.is_file() and path.name not in ("ready.json", "config.json"):
            shutil.copy2(path, folder / path.name)
    (folder / "config.json").write_text(json.dumps({**QWEN3_CONFIG, **config}, indent=2))


def _train_async_checks(args: Any) -> None:
    """What ``train_async.train`` checks before its first Ray call (at the pinned commit)."""
    if args.colocate:
        raise AssertionError("Colocation is not supported for async training.")
    validate_async_off_policy_correction(args)


def _parse(script: str, argv: list[str], env: dict[str, str], report: list[str]) -> dict[str, Any]:
    started = time.monotonic()
    stderr = io.StringIO()
    try:
        # stderr caught: argparse's message on a rejected flag is its last line.
        with _environment(env), _hopper(), patch("sys.argv", [script, *argv]), contextlib.redirect_stderr(stderr):
            args = parse_args()
            if script == "train_async.py":
                _train_async_checks(args)
    except SystemExit as exc:
        message = stderr.getvalue().strip().splitlines()[-1:] or [f"exit {exc.code}"]
        return {"ok": False, "error": message[0], "elapsed_s": time.monotonic() - started}
    except Exception as exc:
        print(traceback.format_exc(), file=sys.stderr)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "elapsed_s": time.monotonic() - started}
    finally:
        sys.stderr.write(stderr.getvalue())
    values = {name: _plain(getattr(args, name, "<absent>")) for name in report}
    values["tito_bound_parsers"] = _bound_parsers(args.tito_model)
    return {"ok": True, "values": values, "elapsed_s": time.monotonic() - started}


def _plain(value: Any) -> Any:
    """``value`` with Miles' config objects (dataclasses, pydantic models) as dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def main() -> None:
    request = json.loads(sys.stdin.read())
    _checkpoint(Path(request["checkpoint"]), Path(request["tokenizer_cache"]), request["config"])
    added = _register_miles_tool_call_parsers()
    results = {
        case["name"]: _parse(case.get("script", "train.py"), case["argv"], case["env"], request["report"])
        for case in request["cases"]
    }
    reply = {"import_s": _IMPORT_S, "added_tool_call_parsers": added, "results": results}
    _REPLY.write(json.dumps(reply, default=str) + "\n")


if __name__ == "__main__":
    main()
