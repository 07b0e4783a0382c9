"""Reading Miles ``Sample`` objects without importing Miles (Miles ``miles/utils/types.py``; docs/upstream.md).

The reward hook, the group filter and the rollout metrics all receive Miles samples,
and all must work in tests and tools where Miles is not installed. They read samples
through these accessors, which rely only on the attributes of Miles' ``Sample``
dataclass (``metadata``, ``status``) and accept the nested lists Miles passes when one
prompt yields several samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


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


def record_of(sample: Any) -> dict[str, Any] | None:
    """The ``nemogym`` episode record the agent function wrote, if any."""
    record = metadata_of(sample).get("nemogym")
    return record if isinstance(record, dict) else None


def is_aborted(sample: Any) -> bool:
    """Whether ``sample.status`` is Miles' ``Sample.Status.ABORTED``."""
    status = getattr(sample, "status", None)
    name = getattr(status, "name", None) or getattr(status, "value", None) or status
    return isinstance(name, str) and name.lower() == "aborted"


def episodes(samples: Iterable[Any]) -> list[dict[str, Any]]:
    """The distinct episode records among ``samples`` (one episode may span samples)."""
    seen: set[str] = set()
    records = []
    for sample in samples:
        record = record_of(sample)
        if record is None:
            continue
        episode_id = record.get("episode_id")
        if isinstance(episode_id, str):  # anything else is a corrupted record: its own episode
            if episode_id in seen:
                continue
            seen.add(episode_id)
        records.append(record)
    return records
