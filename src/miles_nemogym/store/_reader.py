"""Read an episode store back, each episode with its role and step and each problem with its place;
never raises over what is on disk. Also the words every view (smoke and scan too) shows of one."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import stat
import zlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from miles_nemogym.episode.record import SWE_ENVIRONMENT, EpisodeRecord, finite, parse_record, passed
from miles_nemogym.store import ROLES

__all__ = ["StoredEpisode", "count_text", "load", "reward_text", "verdict"]

UNFILED = "no step has trained or dropped it yet"  # a sealed episode no filing names, in a role with filings

# step-000005-<file id>.jsonl.gz (older stores: step-000005.jsonl.gz), pending-<file id>.jsonl
_NAME = re.compile(r"(?P<stem>(?:step-(?P<step>\d+)|pending)(?:-[\w-]*)?)(?P<ext>\.heads|\.jsonl|\.jsonl\.gz)")
# step-000005-<file id>.filing: the episodes step 5 trained, and those dropped before it
_FILING = re.compile(r"step-(?P<step>\d+)-[\w-]+\.filing")


def verdict(*, masked: bool, failure_kind: object, swe: bool, passed: bool) -> str:
    """The verdict word every view shows: the failure kind (else ``masked``), resolved/unresolved, passed/failed."""
    if masked:
        return str(failure_kind or "masked")
    if swe:
        return "resolved" if passed else "unresolved"
    return "passed" if passed else "failed"


def count_text(value: object) -> str:
    """A record's count (turns, tool calls) as every view shows it: ``-`` when it has none."""
    return "-" if value is None else str(value)


_REWARD_DECIMALS = 4  # enough to tell a partial reward (1/3 shows as 0.3333) from a binary one


def reward_text(value: object) -> str:
    """A reward as every view shows it: 4 decimals, a partial one never rounded to a whole one (``0.99996``
    is ``0.9999``); ``-`` for anything but a finite number (None, a boolean, a string, NaN)."""
    number = finite(value)
    if number is None:
        return "-"
    number += 0.0  # -0.0 shows as 0.0
    shown = round(number, _REWARD_DECIMALS)
    if shown.is_integer() and shown != number:  # one step back toward the partial reward
        shown = round(shown + math.copysign(10.0**-_REWARD_DECIMALS, number - shown), _REWARD_DECIMALS)
    return repr(shown)


@dataclass(frozen=True)
class Problem:
    """Something the reader skipped or found odd: a file, or one line of it (``line`` counts from 1)."""

    path: str
    line: int | None
    reason: str

    def __str__(self) -> str:
        return f"{self.path}{'' if self.line is None else f':{self.line}'}: {self.reason}"


@dataclass
class StoredEpisode:
    """One episode as stored (``entry``: the line's fields; ``answer`` only when loaded)."""

    entry: dict[str, Any]
    step: int | None  # the rollout step (fully async: that trained it, or it was dropped during); None: pending
    role: str
    not_trained: str | None = None  # fully async: why the buffer dropped its group (its step's filing says)
    source: Problem | None = None  # the file and line it was read from (``reason`` empty)

    @property
    def record(self) -> dict[str, Any]:
        record = self.entry.get("record")
        return record if isinstance(record, dict) else {}

    @property
    def episode_id(self) -> str:
        return str(self.entry.get("episode_id") or "")

    @property
    def instance_id(self) -> str:
        return str(self.entry.get("instance_id") or self.record.get("instance_id") or "")

    @property
    def environment(self) -> str:
        """The record's environment; ``swe`` when it names none (SWE rows, older stores)."""
        environment = self.record.get("environment")
        return environment if isinstance(environment, str) and environment else SWE_ENVIRONMENT

    @property
    def typed(self) -> EpisodeRecord | None:
        """The record read by the one record reader (``record.parse_record``); None when there is none."""
        return parse_record(self.entry.get("record")).record

    @property
    def kind(self) -> str:
        return verdict(
            masked=self.masked,
            failure_kind=self.record.get("failure_kind"),
            swe=self.environment == SWE_ENVIRONMENT,
            passed=self.passed,
        )

    @property
    def masked(self) -> bool:
        """Set aside, not trained on: the typed record says so, or there is no readable record."""
        record = self.typed
        return record is None or record.mask_sample

    @property
    def passed(self) -> bool:
        """A valid episode that resolved its SWE instance or passed its environment's task (``record.passed``)."""
        record = self.typed
        return record is not None and passed(record, self.entry.get("reward"))


@dataclass
class Store:
    episodes: list[StoredEpisode] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # what was skipped or found odd, in order


class _Record(BaseModel):
    """The record's fields the views read, with the types they need."""

    model_config = ConfigDict(strict=True, extra="allow")
    status: str | None = None
    instance_id: str | None = None
    mask_sample: bool | None = None
    resolved: bool | None = None
    failure_kind: str | None = None
    failure_reason: str | None = None
    attempts: int | None = None
    elapsed_s: float | None = None
    turns: int | None = None
    environment: str | None = None


class _Head(BaseModel):
    """A store line's fields, other than the answer, with the types the views need."""

    model_config = ConfigDict(strict=True, extra="allow")
    episode_id: str | None = None
    instance_id: str | None = None
    eval_set: str | None = None
    session_id: str | None = None
    finished_at: float | None = None
    reward: float | None = None
    record: _Record | None = None


def load(directory: Path, *, answers: bool = False, steps: Collection[int | None] | None = None) -> Store:
    """The episodes under ``directory`` (of ``steps`` only, if given; None: pending) by role, step, finish
    time; with ``answers``, each with its ``/run`` answer."""
    store = Store()
    for role in ROLES:
        folder = directory / role
        groups: dict[str, tuple[int | None, dict[str, Path]]] = {}  # stem -> (its step, its files by extension)
        paths = _files(folder, store.problems)
        filed = _filed([(p, int(m["step"])) for p in paths if (m := _FILING.fullmatch(p.name))], store.problems)
        # An episode is filed at or after the step it was sealed under: with filings, read every
        # sealed step up to the last asked for (and pending), then keep the episodes by their filed step.
        last = max((s for s in steps or () if s is not None), default=-1) if filed else None
        for path in paths:
            match = _NAME.fullmatch(path.name)
            if match is None:
                continue
            step = None if match["step"] is None else int(match["step"])
            if steps is None or step in steps or (last is not None and (step is None or step <= last)):
                groups.setdefault(match["stem"], (step, {}))[1][match["ext"]] = path
        for step, found in groups.values():
            data = [found[ext] for ext in (".jsonl.gz", ".jsonl") if ext in found]
            if not data:
                store.problems.append(Problem(str(found[".heads"]), None, "skipped: heads without their episodes file"))
                continue
            sources = [found[".heads"]] if ".heads" in found and not answers else data
            seen: set[str] = set()  # a crash between compressing and removing the plain file
            for path, number, entry in _entries(sources, answers, store.problems):
                episode_id = entry.get("episode_id")
                if isinstance(episode_id, str) and episode_id:
                    if episode_id in seen:
                        continue
                    seen.add(episode_id)
                filing = filed.get(episode_id) if isinstance(episode_id, str) else None
                # Unfiled: where it was sealed; in a role with filings, not trained yet.
                at, why = filing or (step, UNFILED if filed and step is not None else None)
                episode = StoredEpisode(entry, at, role, why, Problem(str(path), number, ""))
                if steps is None or episode.step in steps:
                    store.episodes.append(episode)
    store.episodes.sort(
        key=lambda e: (e.role, 1 << 60 if e.step is None else e.step, finite(e.entry.get("finished_at")) or 0.0)
    )
    return store


class _Filed(BaseModel):
    """One line of a filing."""

    model_config = ConfigDict(strict=True, extra="ignore")
    episode_id: str
    trained: bool
    reason: str | None = None


def _filed(paths: list[tuple[Path, int]], problems: list[Problem]) -> dict[str, tuple[int, str | None]]:
    """Episode id -> (its filed step, why not trained or None), from the (filing, step) ``paths`` (the latest wins)."""
    filed: dict[str, tuple[int, str | None]] = {}
    for path, step in paths:
        for number, line in _lines(path, problems):
            try:
                item = _Filed.model_validate_json(line)
            except ValidationError as error:
                reason = error.errors()[0]["msg"]
                problems.append(Problem(str(path), number, f"skipped: not a filing line ({reason})"))
                continue
            filed[item.episode_id] = (step, None if item.trained else item.reason or "no reason given")
    return filed


def _files(folder: Path, problems: list[Problem]) -> list[Path]:
    """The regular files in ``folder`` by name, reporting what is not one (links are not followed)."""
    try:
        if not stat.S_ISDIR(folder.lstat().st_mode):
            problems.append(Problem(str(folder), None, "skipped: not a folder (or a link)"))
            return []
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as error:
        problems.append(Problem(str(folder), None, f"skipped: cannot be listed: {error}"))
        return []
    files = []
    for entry in entries:
        if entry.name.startswith("."):  # the writer's temporary files
            continue
        try:
            regular = entry.is_file(follow_symlinks=False)
        except OSError:
            regular = False
        if regular:
            files.append(Path(entry.path))
        elif _NAME.fullmatch(entry.name) or _FILING.fullmatch(entry.name):
            problems.append(Problem(entry.path, None, "skipped: not a regular file (a folder or a link)"))
    return files


def _entries(paths: list[Path], answers: bool, problems: list[Problem]) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    for path in paths:
        for number, line in _lines(path, problems):
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError) as error:
                deep = isinstance(error, RecursionError)
                why = "JSON nested too deeply to read" if deep else "not a whole JSON line (cut by a crash?)"
                problems.append(Problem(str(path), number, f"skipped: {why}"))
                continue
            if not isinstance(entry, dict):
                problems.append(Problem(str(path), number, f"skipped: a JSON {type(entry).__name__}, not an object"))
                continue
            try:
                _Head.model_validate(entry)
            except ValidationError as error:  # kept: the views show what they can of it
                wrong = "; ".join(f"{'.'.join(map(str, item['loc']))} ({item['msg']})" for item in error.errors())
                problems.append(Problem(str(path), number, f"kept, with a field of the wrong type: {wrong}"))
            if not answers:
                entry.pop("answer", None)
            yield path, number, entry


def _lines(path: Path, problems: list[Problem]) -> Iterator[tuple[int, bytes]]:
    """``path``'s non-blank lines, numbered from 1, gunzipped if ``.gz``; damage ends it with a problem."""
    number = 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(fd, "rb") as raw:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                problems.append(Problem(str(path), None, "skipped: not a regular file"))
                return
            handle = gzip.GzipFile(fileobj=raw) if path.name.endswith(".gz") else raw
            for number, line in enumerate(handle, 1):
                if line.strip():
                    yield number, line
    except (OSError, EOFError, zlib.error) as error:
        problems.append(Problem(str(path), number + 1, f"skipped from here on: unreadable ({error})"))
