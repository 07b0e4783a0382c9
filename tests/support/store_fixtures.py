"""Episode stores the ``episodes`` tests browse, one fixture per kind of store, each under the
test's ``tmp_path`` (registered for every module by tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.episode.record import EpisodeRecord
from miles_nemogym.store import EpisodeStore, entry_for
from tests.support.episode_stores import build_store
from tests.support.hostile_store import entry, write_step
from tests.support.plot_store import build_plot_store

__all__ = ["LONG_ID", "WIDE_KINDS", "one_episode_store", "plot_store", "wheel_store", "wide_store"]

LONG_ID = "scikit-learn__scikit-learn-14141"
"""The longest instance id of the wheel's rows: what a table must never split."""
WIDE_KINDS = ["agent_run_error", "provider_oom_killed", "transport_unreachable", "agent_timeout", "verifier_error"]
"""The failure kinds ``wide_store``'s failed episodes take in turn."""


@pytest.fixture
def wheel_store(tmp_path: Path, gym_example_rollouts: list[dict[str, Any]]) -> Path:
    """``episode_stores.build_store`` over the wheel's five real ``/run`` results."""
    build_store(tmp_path / "ep", gym_example_rollouts)
    return tmp_path / "ep"


@pytest.fixture
def plot_store(tmp_path: Path) -> Path:
    """``plot_store.build_plot_store``: steps 1, 2, 4 and two eval sets, for the curves."""
    return build_plot_store(tmp_path / "ep")


@pytest.fixture
def one_episode_store(tmp_path: Path) -> Path:
    """Train step 1 holding one episode without an answer."""
    write_step(tmp_path / "ep", "train", 1, [entry("a", None)])
    return tmp_path / "ep"


@pytest.fixture
def wide_store(tmp_path: Path) -> Path:
    """Train step 1 with 12 episodes of ``LONG_ID``-long ids: every other one failed, by
    ``WIDE_KINDS`` in turn; for the width checks."""
    folder = tmp_path / "episodes"
    writer = EpisodeStore(folder)
    for number in range(12):
        instance = f"{LONG_ID}{number}"
        failed = WIDE_KINDS[number % len(WIDE_KINDS)] if number % 2 else None
        record = {"status": "failed", "mask_sample": True, "failure_kind": failed, "failure_reason": "boom",
                  "turns": None} if failed else {"status": "ok", "mask_sample": False, "resolved": number % 4 == 0,
                                                 "patch_applied": True, "turns": 41}  # fmt: skip
        record.update(episode_id=f"{number:02d}{'0123456789abcdef' * 2}"[:32], instance_id=instance,
                      attempts=1, elapsed_s=267.4)  # fmt: skip
        added = entry_for(record=EpisodeRecord.model_validate(record), reward=0.0, role="train", eval_set=None,
                          session=f"s{number}", repo="scikit-learn")  # fmt: skip
        writer.add("train", added, b"{}", True)
    writer.seal("train", 1)
    writer.close()
    return folder
