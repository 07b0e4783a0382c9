"""What Miles does around our hooks, per CONTRACTS.md §1-4 (Miles is not on PyPI).

Only the calling convention is reproduced: load by dotted path, keyword-only call with
``sample.metadata`` plus Miles' bookkeeping keys, the returned dict merged into the
sample's metadata; the Sample dataclass shape the hooks read.
"""

from __future__ import annotations

import copy
import enum
import importlib
from dataclasses import dataclass, field
from typing import Any


class Status(enum.Enum):
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class Sample:
    prompt: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    status: Status = Status.COMPLETED
    reward: float | None = None
    remove_sample: bool = False

    Status = Status


def load_function(path: str) -> Any:
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


async def agentic_generate(
    agent_path: str,
    sample: Sample,
    *,
    session_url: str,
    sampling_params: dict[str, Any],
    max_seq_len: int | None = 16384,
) -> Sample:
    """One sample through the agent function as ``agentic_tool_call.generate`` calls it."""
    fn = load_function(agent_path)
    metadata = dict(sample.metadata)
    if max_seq_len is not None:
        metadata["max_seq_len"] = max_seq_len
    metadata["session_server_instance_id"] = 0
    metadata["session_server_id"] = session_url.split("//", 1)[1].split("/", 1)[0]
    renames = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed"}
    request_kwargs = {renames.get(k, k): v for k, v in sampling_params.items() if v is not None}
    frozen = copy.deepcopy(metadata)
    result = await fn(base_url=session_url, prompt=sample.prompt, request_kwargs=request_kwargs, metadata=metadata)
    assert metadata == frozen, "the agent function mutated the metadata Miles passed"
    out = copy.deepcopy(sample)
    if result:
        out.metadata.update(result)
    return out
