"""Read files shipped inside the pinned ``nemo-gym`` wheel without installing it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from miles_nemogym.pins import NEMO_GYM_VERSION

__all__ = ["cached_wheel", "example_rows"]

EXAMPLES_MEMBER = "responses_api_agents/mini_swe_agent_2/data/example.jsonl"
_ROLLOUTS_MEMBER = "responses_api_agents/mini_swe_agent_2/data/example_rollouts.jsonl"


def cache_dir() -> Path:
    """``$MILES_NEMOGYM_CACHE``, else ``$XDG_CACHE_HOME/miles-nemogym`` or ``~/.cache/...``."""
    explicit = os.environ.get("MILES_NEMOGYM_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "miles-nemogym"


def cached_wheel(version: str = NEMO_GYM_VERSION) -> Path | None:
    """The cached wheel if a first use downloaded it, else None (nothing is downloaded)."""
    target = cache_dir() / "wheels" / f"nemo_gym-{version}-py3-none-any.whl"
    return target if target.exists() else None


def wheel_path(version: str = NEMO_GYM_VERSION) -> Path:
    """The cached wheel, downloaded with pip on first use."""
    target = cache_dir() / "wheels" / f"nemo_gym-{version}-py3-none-any.whl"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--ignore-requires-python", "--disable-pip-version-check",
            f"nemo-gym=={version}", "-d", tmp,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        downloaded = Path(tmp) / target.name
        if done.returncode != 0 or not downloaded.exists():
            raise RuntimeError(
                f"could not download nemo-gym=={version} with pip (exit {done.returncode}): "
                f"{done.stderr.strip()[-500:]}"
            )
        # Rename within one folder is atomic: a concurrent reader never sees half a wheel.
        shutil.move(str(downloaded), str(target))
    return target


@lru_cache(maxsize=2)
def _archive(path: Path, mtime_ns: int, size: int) -> zipfile.ZipFile:
    return zipfile.ZipFile(path)


@lru_cache(maxsize=2)
def _members(path: Path, mtime_ns: int, size: int) -> frozenset[str]:
    return frozenset(_archive(path, mtime_ns, size).namelist())


def ships(member: str, version: str = NEMO_GYM_VERSION) -> bool:
    """Whether the wheel holds ``member`` (a path inside it, ``resources_servers/x/data/y``)."""
    path = wheel_path(version)
    stat = path.stat()
    return member in _members(path, stat.st_mtime_ns, stat.st_size)


@contextlib.contextmanager
def opened(version: str = NEMO_GYM_VERSION) -> Iterator[zipfile.ZipFile]:
    """The cached wheel, opened once per process and file version (its ~5,000-member index takes ~0.2 s)."""
    path = wheel_path(version)
    stat = path.stat()
    yield _archive(path, stat.st_mtime_ns, stat.st_size)


def read_member(member: str, version: str = NEMO_GYM_VERSION) -> bytes:
    with opened(version) as wheel:
        return wheel.read(member)


def _jsonl(member: str) -> list[dict[str, Any]]:
    text = read_member(member).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def example_rows() -> list[dict[str, Any]]:
    """The five SWE-bench Verified rows nemo-gym ships for ``mini_swe_agent_2``."""
    return _jsonl(EXAMPLES_MEMBER)


def example_rollouts() -> list[dict[str, Any]]:
    """The five real ``/run`` results nemo-gym ships for ``mini_swe_agent_2``."""
    return _jsonl(_ROLLOUTS_MEMBER)
