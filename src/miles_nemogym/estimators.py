"""The two estimators the rollout metrics and the episodes page share, so a curve on the page
is the logged metric: unbiased pass@k and the nearest-rank percentile. Pure; no imports of
the hooks, so ``store/`` can use them."""

from __future__ import annotations

import math

__all__ = ["pass_at_k", "percentile"]


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
