"""One validated SWE-bench task row -> one Miles prompt row, with its subset and split (flag, then
row, then dataset name; docs/data-and-checks.md). Pure."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from miles_nemogym.data._environments import chat_prompt
from miles_nemogym.data._schema import SUBSETS, FieldProblem, SweBenchInstance, validate_instance
from miles_nemogym.episode.record import ENV_KEY, ROUTING_KEYS, SWE_ENVIRONMENT, Task


@dataclass(frozen=True)
class DatasetKind:
    """What a dataset's name says about its rows (both None when the name is not known)."""

    subset: str | None
    split: str | None


# Normalised dataset names (lower case, '_'/' '/'.' → '-') and what they imply.
_KNOWN_NAMES = {
    **dict.fromkeys(("swe-bench", "swe-bench-lite", "swe-bench-verified"), DatasetKind("verified", "test")),
    **dict.fromkeys(("swe-gym", "swe-gym-lite"), DatasetKind("gym", "train")),
}
# A file stem may carry the split and shard: "swe-bench-verified-test-00000-of-00001".
_SPLIT_SUFFIX = re.compile(r"-(test|train|dev|validation)(-.*)?$")


def _normalise(name: str) -> str:
    # Hugging Face cache folders look like "datasets--princeton-nlp--SWE-bench_Verified".
    name = name.lower().rsplit("--", 1)[-1].rsplit("/", 1)[-1]
    return re.sub(r"[_ .]+", "-", name).strip("-")


def _lookup(name: str) -> DatasetKind | None:
    normalised = _normalise(name)
    return _KNOWN_NAMES.get(normalised) or _KNOWN_NAMES.get(_SPLIT_SUFFIX.sub("", normalised))


def infer_kind(source: str) -> DatasetKind:
    """Subset and default split implied by a hub id (``princeton-nlp/SWE-bench_Lite``) or a path (its
    stem first, then each parent folder, nearest first)."""
    path = PurePath(source)  # a bare name is its own stem
    parts = [source, path.stem, *(parent.name for parent in path.parents)]
    return next((found for part in parts if part and (found := _lookup(part))), DatasetKind(None, None))


@dataclass(frozen=True)
class Routing:
    """The caller's choices for ``subset``/``split``; ``None`` fields defer to row, then name."""

    explicit_subset: str | None
    explicit_split: str | None
    inferred: DatasetKind
    fallback_split: str = "test"


def resolve_routing(row: Mapping[str, Any], routing: Routing) -> tuple[str, str, bool] | list[FieldProblem]:
    """``(subset, split, overrode_row)`` for one row, or why it has no usable subset."""
    row_subset = row.get("subset")
    row_split = row.get("split")
    subset = routing.explicit_subset or row_subset or routing.inferred.subset
    split = routing.explicit_split or row_split or routing.inferred.split or routing.fallback_split
    if subset is None:
        return [
            FieldProblem(
                "subset",
                "missing",
                "is unknown: the row has none and the dataset name does not say; pass "
                "--subset verified (official SWE-bench images) or --subset gym (SWE-Gym images)",
            )
        ]
    if not isinstance(subset, str) or subset not in SUBSETS:
        return [
            FieldProblem(
                "subset",
                "bad_value",
                f"is {subset!r}, not one of {', '.join(SUBSETS)} (the server picks the task "
                "image by it); pass --subset to override the row's value",
            )
        ]
    if not isinstance(split, str) or not split:
        return [FieldProblem("split", "wrong_type", f"must be a non-empty string (got {split!r})")]
    overrode = (routing.explicit_subset is not None and row_subset not in (None, subset)) or (
        routing.explicit_split is not None and row_split not in (None, split)
    )
    return subset, split, overrode


def to_prompt_row(
    row: Mapping[str, Any], instance: SweBenchInstance, *, subset: str, split: str, drop_fields: Collection[str] = ()
) -> dict[str, Any]:
    """``{"prompt": [user message], "metadata": {row…, subset, split}}``: the row's fields but ``drop_fields``
    and the routing keys (secrets come from the trainer, never from data), test lists decoded."""
    metadata = {key: value for key, value in row.items() if key not in drop_fields and key not in ROUTING_KEYS}
    metadata.update(FAIL_TO_PASS=instance.FAIL_TO_PASS, PASS_TO_PASS=instance.PASS_TO_PASS, subset=subset, split=split)
    return {"prompt": [{"role": "user", "content": instance.problem_statement}], "metadata": metadata}


def checked_swe_prompt_row(row: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | FieldProblem:
    """``(instance_id, row)`` for a prompt row this converter wrote from a SWE-bench row, to be mixed with
    environment rows as is (routing keys dropped, as :func:`to_prompt_row` does); or why it is not one."""
    metadata = row.get("metadata")
    if not isinstance(row.get("prompt"), list) or not isinstance(metadata, Mapping):
        return FieldProblem(
            "metadata", "missing", "is missing: swe=FILE takes convert's output for SWE-bench rows; convert them first"
        )
    instance = validate_instance(metadata)
    if isinstance(instance, list):
        return FieldProblem(f"metadata.{instance[0].field}", instance[0].rule, instance[0].message)
    if metadata.get(ENV_KEY, SWE_ENVIRONMENT) != SWE_ENVIRONMENT:  # convert keeps a row's own "swe" mark
        return FieldProblem(
            f"metadata.{ENV_KEY}",
            "bad_value",
            f"is {metadata[ENV_KEY]!r}: swe=FILE takes convert's output for SWE-bench rows, marked 'swe' or not at all",
        )
    if metadata.get("subset") not in SUBSETS:
        return FieldProblem("metadata.subset", "bad_value", f"must be one of {', '.join(SUBSETS)} on a SWE-bench row")
    kept = {key: value for key, value in metadata.items() if key not in ROUTING_KEYS}
    return instance.instance_id, {**row, "metadata": kept}


def prompt_row_problem(row: Any) -> str | None:
    """Why ``row`` (a prompt row Miles reads) cannot run, by the converter's own rules; None when it can."""
    if not isinstance(row, dict):
        return "is not a JSON object"
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) for m in prompt):
        return "'prompt' must be a non-empty list of chat messages (Miles' TITO session needs one)"
    metadata = row.get("metadata")
    if not isinstance(metadata, dict):
        return "'metadata' (the SWE-bench instance or the task row) is missing or not an object"
    environment = Task.of(metadata).environment
    if environment != SWE_ENVIRONMENT:
        # The converter's own rule: what the episode's first chat request is built from.
        problem = chat_prompt(metadata)
        if isinstance(problem, FieldProblem):
            return (
                f"an environment row ({ENV_KEY}={environment!r}): metadata.{problem.field} {problem.message}; "
                "convert NeMo-Gym task rows with `miles-nemogym convert --env NAME=FILE`"
            )
        return None
    # The converter's own rules: what the server and the SWE-bench grader read.
    checked = validate_instance(metadata)
    if isinstance(checked, list):
        instance = metadata.get("instance_id", "?")
        return f"instance {instance}: metadata." + "; metadata.".join(map(str, checked))
    return None
