"""Which of the input's instances a scan runs: ``--instance-ids``, then ``--limit``."""

from __future__ import annotations

from miles_nemogym.scan._inputs import InputError, ScanTask

__all__ = ["select"]


def select(tasks: list[ScanTask], instance_ids: list[str] | None, limit: int | None) -> list[ScanTask]:
    """The tasks to scan, in input order. Unknown ids are an error: a typo would otherwise
    shrink the scan silently."""
    selected = tasks
    if instance_ids is not None:
        wanted = set(instance_ids)
        known = {task.instance_id for task in tasks}
        missing = [item for item in instance_ids if item not in known]
        if missing:
            shown = ", ".join(missing[:10]) + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else "")
            raise InputError(f"--instance-ids: not in the input file: {shown}")
        selected = [task for task in tasks if task.instance_id in wanted]
    if limit is not None:
        if limit < 1:
            raise InputError(f"--limit {limit}: must be at least 1")
        selected = selected[:limit]
    return selected
