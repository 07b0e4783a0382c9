"""What the rollout metrics and the episodes page share, so a curve on the page is the logged
metric: unbiased pass@k, the nearest-rank percentile, and when an environment episode passes.
Pure; no imports of the hooks, so ``store/`` can use them."""

from __future__ import annotations

import math

__all__ = ["PASS_REWARD", "pass_at_k", "passes", "percentile"]

PASS_REWARD = 1.0
"""A valid episode of a resources-server environment passes with this reward or more (full
credit); partial credit shows in the reward mean, not in pass@k (docs/episode-store.md)."""


def passes(reward: object) -> bool:
    """Whether an environment episode's ``reward`` (any store or metadata value) is a pass."""
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return False
    return math.isfinite(reward) and reward >= PASS_REWARD


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one instance with ``n`` valid episodes, ``c`` of them resolved
    (Chen et al. 2021: 1 - C(n-c, k) / C(n, k)); needs ``n >= k``."""
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} episodes, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
