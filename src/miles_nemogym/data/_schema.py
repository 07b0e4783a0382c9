"""What a SWE-bench task row must hold before it may become a Miles prompt row: a row missing what
the server and the grader read would cost a paid episode that can only score 0."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictStr, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from miles_nemogym import errors

__all__ = [
    "SUBSETS",
    "FieldProblem",
    "SweBenchInstance",
    "decode_test_lists",
    "validate_instance",
]

Subset = Literal["verified", "gym"]
"""``verified`` → official SWE-bench images; ``gym`` → SWE-Gym images (``mini_swe_agent_2`` picks by it)."""
SUBSETS: tuple[str, ...] = get_args(Subset)


def _decode_test_list(value: Any) -> Any:
    # The HF parquet of SWE-bench stores these lists as JSON-encoded strings; the
    # server and grader accept both, but one shape in the output keeps consumers simple.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise PydanticCustomError(
                "test_list_json", "is a string but not a JSON list of test names ({error})", {"error": str(error)}
            ) from None
    return value


_TestList = Annotated[list[StrictStr], BeforeValidator(_decode_test_list)]
_NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]


class SweBenchInstance(BaseModel):
    """The typed view of one task row; unknown fields are ignored here and kept by the mapper."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    instance_id: _NonEmptyStr
    repo: Annotated[StrictStr, Field(pattern=r"^[^/\s]+/[^/\s]+$")]
    base_commit: _NonEmptyStr
    problem_statement: _NonEmptyStr
    version: _NonEmptyStr
    patch: StrictStr
    test_patch: _NonEmptyStr
    FAIL_TO_PASS: Annotated[_TestList, Field(min_length=1)]
    PASS_TO_PASS: _TestList
    environment_setup_commit: StrictStr | None = None
    hints_text: StrictStr | None = None
    subset: StrictStr | None = None
    split: StrictStr | None = None
    responses_create_params: dict[str, Any] | None = None


REQUIRED_FIELDS: tuple[str, ...] = tuple(
    name for name, spec in SweBenchInstance.model_fields.items() if spec.is_required()
)
"""Fields every row must carry (the server, the grader and golden scans read them)."""
NEVER_DROPPED: frozenset[str] = frozenset({*REQUIRED_FIELDS, "subset", "split"})
"""What ``--drop-fields`` may not drop: the required fields and the routing ones the converter sets."""


@dataclass(frozen=True)
class FieldProblem:
    """One broken rule on one field. ``rule`` is a short, stable name for counting."""

    field: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


_HINTS = {
    "version": "quote it in the source data (SWE-bench versions are strings: '0.20' is not 0.2)",
    "FAIL_TO_PASS": "give a list of test names, or a string holding a JSON list of them",
    "PASS_TO_PASS": "give a list of test names (may be empty), or a string holding a JSON list",
    "repo": "use the GitHub 'owner/name' form, e.g. 'django/django'",
    "responses_create_params": 'NeMo-Gym rows carry an object here, e.g. {"input": []}',
}


def _rule(error_type: str) -> str:
    if error_type == "missing":
        return "missing"
    if error_type.endswith("_type") or error_type == "is_instance_of":
        return "wrong_type"
    return "bad_value"


def _describe(error: ErrorDetails, field: str | None = None) -> FieldProblem:
    loc = (field, *error["loc"]) if field else error["loc"]
    field = str(loc[0]) if loc else "<row>"
    where = field + "".join(f"[{part}]" for part in loc[1:])
    rule = _rule(error["type"])
    if rule == "missing":
        message = "is missing (the server and the SWE-bench grader need it)"
    else:
        got = error["input"]
        shown = repr(got) if not isinstance(got, str) or len(got) <= 40 else repr(got[:40] + "…")
        message = f"{errors.message(error)} (got {type(got).__name__} {shown})"
        if where != field:
            message = f"{where}: {message}"
    if field in _HINTS:
        message = f"{message}; {_HINTS[field]}"
    return FieldProblem(field=field, rule=rule, message=message)


_TEST_LIST: TypeAdapter[list[str]] = TypeAdapter(_TestList)


def decode_test_lists(metadata: dict[str, Any]) -> None:
    """The row's ``FAIL_TO_PASS``/``PASS_TO_PASS`` as lists, in place (JSON strings decoded, as the converter
    writes them); ``ValueError`` names the field and the fix."""
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        if name in metadata:
            try:
                metadata[name] = _TEST_LIST.validate_python(metadata[name], strict=True)
            except ValidationError as error:
                raise ValueError(str(_describe(error.errors(include_url=False)[0], name))) from None


def validate_instance(row: Mapping[str, Any]) -> SweBenchInstance | list[FieldProblem]:
    """Check one row; returns the typed instance, or every problem found (never raises)."""
    try:
        return SweBenchInstance.model_validate(row)
    except ValidationError as error:
        return [_describe(item) for item in error.errors(include_url=False)]
