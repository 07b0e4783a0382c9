"""Reading Miles ``Sample`` objects without importing Miles (Miles ``miles/utils/types.py``).

The hooks receive Miles samples and must also work where Miles is not installed: they
use only ``Sample.metadata`` and ``Sample.status``, accept the nested lists Miles passes
when one prompt yields several samples, and read the record with ``read_record``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from miles_nemogym.episode.record import EpisodeRecord, RecordRead, read_record


def flatten(samples: Any) -> Iterator[Any]:
    """Every sample in ``samples``: one sample, a list of them, or a list of lists."""
    if isinstance(samples, (list, tuple)):
        for item in samples:
            yield from flatten(item)
    elif samples is not None:
        yield samples


def metadata_of(sample: Any) -> dict[str, Any]:
    metadata = getattr(sample, "metadata", None)
    return metadata if isinstance(metadata, dict) else {}


def read_sample(sample: Any) -> RecordRead:
    """The episode record the agent function wrote on ``sample``, as read."""
    return read_record(metadata_of(sample))


def record_of(sample: Any) -> EpisodeRecord | None:
    """The episode record the agent function wrote on ``sample``, if any."""
    return read_sample(sample).record


def is_aborted(sample: Any) -> bool:
    """Whether ``sample.status`` is Miles' ``Sample.Status.ABORTED``."""
    status = getattr(sample, "status", None)
    name = getattr(status, "name", None) or getattr(status, "value", None) or status
    return isinstance(name, str) and name.lower() == "aborted"


@dataclass(frozen=True)
class Episode:
    """One distinct episode among a rollout's samples."""

    record: EpisodeRecord
    unreadable: frozenset[str]
    """Record fields of a wrong type or value (see ``read_record``)."""
    metadata: dict[str, Any]
    """The metadata of its first sample (the task row: ``repo``, ...)."""


def episodes(samples: Iterable[Any]) -> list[Episode]:
    """The distinct episodes among ``samples`` (one episode may span samples), in order;
    a record without a readable ``episode_id`` is an episode of its own."""
    seen: set[str] = set()
    out = []
    for sample in samples:
        read = read_sample(sample)
        if read.record is None:
            continue
        episode_id = read.record.episode_id
        if episode_id is not None:
            if episode_id in seen:
                continue
            seen.add(episode_id)
        out.append(Episode(read.record, read.unreadable, metadata_of(sample)))
    return out
