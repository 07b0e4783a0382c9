"""Golden and API-policy scans, checking a NeMo-Gym server before any GPU time is spent; ``execute`` runs one."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from miles_nemogym.errors import counted, describe
from miles_nemogym.scan._config import ScanConfig
from miles_nemogym.scan._runner import EXIT_USAGE, ScanResult, ScanUsageError, run_scan
from miles_nemogym.settings import Settings

__all__ = ["execute"]


def _redact(settings: Settings, record: logging.LogRecord) -> bool:
    """Removes the policy API key from every log record (in case a library's error quotes a request)."""
    message = record.getMessage()
    clean = settings.scrub_text(message)
    if clean != message:
        record.msg, record.args = clean, None
    error = record.exc_info[1] if record.exc_info else None
    if error is not None and settings.scrub_text(str(error)) != str(error):
        record.exc_info, record.exc_text = None, None
    return True


def _install_logging(err: Console) -> logging.Handler:
    handler = logging.StreamHandler(err.file)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    with contextlib.suppress(Exception):  # settings that cannot be read: the scan reports them, with their fix
        settings = Settings.from_env()
        if settings.key_scrubber() is not None:
            handler.addFilter(functools.partial(_redact, settings))
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.WARNING:
        root.setLevel(logging.WARNING)
    return handler


async def _main(config: ScanConfig, console: Console, err: Console) -> ScanResult:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            err.print(
                f"[yellow]{sig.name}: stopping — cancelling in-flight episodes, keeping finished results "
                "(press Ctrl-C again to abort at once)[/]"
            )
            stop.set()
        # Back to the default: a second Ctrl-C raises KeyboardInterrupt immediately.
        loop.remove_signal_handler(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread, or no signal support: Ctrl-C then aborts at once
    try:
        return await run_scan(config, console=console, stop=stop)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def execute(*, console: Console, err: Console, **options: Any) -> int:
    """The scan ``options`` (``ScanConfig``'s fields) ask for, run as a program (signals, logging); its exit code."""
    try:
        config = ScanConfig(**options)
    except ValidationError as error:
        err.print(f"scan cannot start: {describe(error)}", markup=False, highlight=False)
        return EXIT_USAGE
    handler = _install_logging(err)
    try:
        result = asyncio.run(_main(config, console, err))
    except ScanUsageError as error:
        err.print(f"[red]scan cannot start:[/] {escape(str(error))}", soft_wrap=not err.is_terminal, highlight=False)
        return EXIT_USAGE
    finally:
        logging.getLogger().removeHandler(handler)
    if result.interrupted:
        err.print(
            f"interrupted: {len(result.results)} of {counted(len(result.selected), 'instance')} have results"
            + (f" in {escape(str(config.output_path))}; rerun with --resume to finish" if config.output_path else ""),
            soft_wrap=not err.is_terminal,
            highlight=False,
        )
    return result.exit_code
