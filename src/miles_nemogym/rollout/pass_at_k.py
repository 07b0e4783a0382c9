"""``nemogym-eval/<set>/*``: what a held-out eval run measured, with infrastructure set aside.

pass@1 and pass@k over valid episodes only, grouped by ``instance_id``; masked episodes are
counted by kind (docs/episode-pipeline.md). Pure functions.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from typing import Any

from miles_nemogym.failure_kinds import metric_label
from miles_nemogym.rollout.ledger import Tally
from miles_nemogym.rollout.samples import episodes, flatten

PREFIX = "nemogym-eval/"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one instance with ``n`` valid episodes, ``c`` of them resolved
    (Chen et al. 2021: 1 - C(n-c, k) / C(n, k)); needs ``n >= k``."""
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} episodes, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _repo_of(metadata: dict[str, Any]) -> str | None:
    repo = metadata.get("repo")
    return repo if isinstance(repo, str) else None


def _repo_label(repo: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "__", repo)


def eval_set_metrics(name: str, samples: Any, k: int, tally: Tally | None = None) -> dict[str, float]:
    """``nemogym-eval/<name>/*`` of one eval set's samples; ``tally`` is the ledger's count
    of the set's episodes (it also sees episodes Miles returned without our record)."""
    flat = list(flatten(samples))
    found = [(e.record, _repo_of(e.metadata)) for e in episodes(flat)]
    valid = [(r, repo) for r, repo in found if not r.mask_sample]
    kinds: Counter[str] = Counter(r.failure_kind or "unknown" for r, _ in found if r.mask_sample)
    total = len(found)
    if tally is not None and tally.episodes >= total:
        # The ledger saw every finished episode; the samples may lack the record-less ones.
        kinds = Counter(tally.failures)
        total = tally.episodes
    masked_count = sum(kinds.values())
    metrics: dict[str, float] = {
        "samples": float(len(flat)),
        "episodes": float(total),
        "episodes_valid": float(len(valid)),
        "episodes_masked": float(masked_count),
        "masked_fraction": masked_count / total if total else 0.0,
    }
    for kind, count in sorted(kinds.items()):
        metrics[f"masked/{metric_label(kind)}"] = float(count)

    by_instance: dict[str, list[bool]] = defaultdict(list)
    for record, _ in valid:
        by_instance[str(record.instance_id)].append(bool(record.resolved))
    # An instance whose episodes all failed has no measurement: it is short of k, not a 0.
    instances = {str(r.instance_id) for r, _ in found}
    metrics["instances"] = float(len(instances))
    if by_instance:
        metrics["pass@1"] = sum(sum(v) / len(v) for v in by_instance.values()) / len(by_instance)
    full = {iid: v for iid, v in by_instance.items() if len(v) >= k}
    metrics["instances_short_of_k"] = float(len(instances) - len(full))
    if full and k > 1:
        metrics[f"pass@{k}"] = sum(pass_at_k(len(v), sum(v), k) for v in full.values()) / len(full)

    if valid:
        records = [r for r, _ in valid]
        metrics["resolve_rate"] = sum(1 for r in records if r.resolved) / len(records)
        metrics["patch_applied_rate"] = sum(1 for r in records if r.patch_applied) / len(records)
        fractions = [f for f in (r.fail_to_pass.fraction for r in records if r.fail_to_pass) if f is not None]
        if fractions:
            metrics["fail_to_pass_fraction_mean"] = sum(fractions) / len(fractions)
        per_repo: dict[str, list[bool]] = defaultdict(list)
        for record, repo in valid:
            if repo:
                per_repo[repo].append(bool(record.resolved))
        for repo, resolved in sorted(per_repo.items()):
            metrics[f"resolve_rate/{_repo_label(repo)}"] = sum(resolved) / len(resolved)
    return {f"{PREFIX}{name}/{key}": value for key, value in metrics.items()}
