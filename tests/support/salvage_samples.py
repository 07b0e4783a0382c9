"""Miles-shaped samples carrying an episode record, for the group filter and salvage tests."""

from __future__ import annotations

from typing import Any

from miles_nemogym.episode.record import EpisodeRecord, Outcome, failure
from tests.support.samples import Sample, Status

__all__ = ["aborted", "failed", "valid"]


def valid(episode: str, task: str = "t1", *, reward: float = 1.0, group: int = 0, **metadata: Any) -> Sample:
    """A sample of a graded episode, with tokens a recovered failed episode can borrow."""
    out = Outcome(reward=reward, record=EpisodeRecord(status="ok", episode_id=episode, instance_id=task))
    return Sample(
        metadata={"instance_id": task, **metadata, **out.to_metadata()},
        reward=reward,
        group_index=group,
        tokens=[11, 12, 13],
        response_length=1,
        loss_mask=[1],
        rollout_log_probs=[-0.5],
        weight_versions=["3"],
    )


def failed(
    episode: str, task: str = "t1", *, kind: str = "transport_peer_drop", group: int = 0, **metadata: Any
) -> Sample:
    """A sample of a failed (masked) episode."""
    out = failure(kind, "it broke")
    out.record.episode_id, out.record.instance_id = episode, task
    return Sample(metadata={"instance_id": task, **metadata, **out.to_metadata()}, reward=0.0, group_index=group)


def aborted(task: str = "t1", *, group: int = 0) -> Sample:
    """Miles' ABORTED copy of an input sample: the row, no agent dict."""
    return Sample(metadata={"instance_id": task}, status=Status.ABORTED, group_index=group)
