"""Which kind of episode a sample is: a training episode or one of a held-out eval set.

Miles' ``--eval-config`` adds ``metadata_overrides`` to every eval sample (Miles
``miles/utils/eval_config.py`` at commit 31f1ca9); the launcher sets the two keys below,
and the ledger, the episode store and ``metrics.log_eval`` read them here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROLE_KEY = "nemogym_role"
EVAL_SET_KEY = "nemogym_eval_set"
KEYS = frozenset({ROLE_KEY, EVAL_SET_KEY})

TRAIN = "train"
EVAL = "eval"


def role_of(metadata: Mapping[str, Any] | None) -> tuple[str, str | None]:
    """(``"train"`` or ``"eval"``, the eval set's name) of a sample's metadata."""
    if not isinstance(metadata, Mapping) or metadata.get(ROLE_KEY) != EVAL:
        return TRAIN, None
    name = metadata.get(EVAL_SET_KEY)
    return EVAL, str(name) if name else "eval"


def ledger_role(role: str, eval_set: str | None) -> str:
    """The ledger's key for an episode: ``train``, or ``eval:<set>`` (one tally per set)."""
    return TRAIN if role == TRAIN else f"{EVAL}:{eval_set}"


def eval_overrides(name: str) -> dict[str, str]:
    """The ``metadata_overrides`` that mark every sample of eval set ``name``."""
    return {ROLE_KEY: EVAL, EVAL_SET_KEY: name}
