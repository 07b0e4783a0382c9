"""Model family -> Miles ``--tito-model`` and the SGLang parsers that family needs.

Miles binds the parsers to each TITO family but does not pass them to SGLang itself, so
the training command must (docs/launcher.md, "Model families and parsers").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from miles_nemogym.errors import MilesNemoGymError


@dataclass(frozen=True)
class ModelFamily:
    name: str
    tito_model: str
    """A value of Miles' ``TITOTokenizerType``."""
    reasoning_parser: str | None
    """SGLang ``--reasoning-parser`` (passed as ``--sglang-reasoning-parser``)."""
    tool_call_parser: str
    """SGLang ``--tool-call-parser`` (passed as ``--sglang-tool-call-parser``)."""
    patterns: tuple[str, ...]
    """Regular expressions matched against the lower-cased checkpoint name."""


# Order matters: the first family whose pattern matches wins (Qwen3-Next before Qwen3).
FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("qwen3-next", "qwennext", "qwen3", "qwen25", (r"qwen3-next", r"qwen3-.*thinking-2507")),
    ModelFamily("qwen3.5", "qwen35", "qwen3", "qwen3_coder", (r"qwen3\.5",)),
    ModelFamily("qwen3", "qwen3", "qwen3", "qwen25", (r"qwen3(?![.\d])",)),
    ModelFamily("glm4.7", "glm47", "glm45", "glm47", (r"glm-?4\.7", r"glm-?5")),
    ModelFamily("nemotron3", "nemotron3", "nemotron_3", "qwen3_coder", (r"nemotron-?3",)),
    ModelFamily("kimi-k2.6", "kimi26", "kimi_k2", "kimi_k2_raw_id", (r"kimi-?k2\.6",)),
    ModelFamily("minimax-m2.5", "minimax_m25", "minimax-append-think", "minimax-m2", (r"minimax-?m2\.5",)),
    ModelFamily("minimax-m2.7", "minimax_m27", "minimax-append-think", "minimax-m2", (r"minimax-?m2\.7",)),
    ModelFamily("deepseek-v3.2", "deepseekv32", "deepseek-v3", "deepseekv32", (r"deepseek-v3\.2",)),
    ModelFamily("deepseek-v4", "deepseekv4", "deepseek-v4", "deepseekv4", (r"deepseek-v4",)),
    ModelFamily("inkling", "inkling", "inkling", "inkling", (r"inkling",)),
)

BY_NAME: dict[str, ModelFamily] = {family.name: family for family in FAMILIES}

_OVERRIDE_FLAGS = "--model-family, or all of --tito-model, --reasoning-parser and --tool-call-parser"


class UnknownFamilyError(MilesNemoGymError, ValueError):
    """The model family cannot be told; the message names the override flags."""


@dataclass(frozen=True)
class Parsers:
    """What the command line gets: the resolved values and where they came from."""

    family: str
    tito_model: str
    reasoning_parser: str | None
    tool_call_parser: str


def detect(checkpoint: str) -> ModelFamily | None:
    """The family whose pattern matches the checkpoint's last path component, if any."""
    name = checkpoint.rstrip("/").rsplit("/", 1)[-1].lower()
    for family in FAMILIES:
        if any(re.search(pattern, name) for pattern in family.patterns):
            return family
    return None


def resolve(
    checkpoint: str,
    *,
    family: str | None = None,
    tito_model: str | None = None,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
) -> Parsers:
    """Family values with per-value overrides; ``reasoning_parser="none"`` means no parser.
    Without a known family, all three values must be given."""
    known = ", ".join(BY_NAME)
    if family is not None:
        chosen = BY_NAME.get(family.lower())
        if chosen is None:
            raise UnknownFamilyError(
                f"--model-family {family!r} is not one of: {known}; pass one of those, or set "
                "--tito-model, --reasoning-parser and --tool-call-parser yourself"
            )
    else:
        chosen = detect(checkpoint)
    if chosen is None:
        missing = [
            flag
            for flag, value in (
                ("--tito-model", tito_model),
                ("--reasoning-parser", reasoning_parser),
                ("--tool-call-parser", tool_call_parser),
            )
            if value is None
        ]
        if missing:
            raise UnknownFamilyError(
                f"cannot tell the model family of {checkpoint!r} (known: {known}); pass "
                f"{_OVERRIDE_FLAGS} (missing: {', '.join(missing)}; '--reasoning-parser none' "
                "for a model without reasoning output)"
            )
        assert tito_model is not None and tool_call_parser is not None
        return Parsers("custom", tito_model, _none(reasoning_parser), tool_call_parser)
    return Parsers(
        chosen.name,
        tito_model or chosen.tito_model,
        _none(reasoning_parser) if reasoning_parser is not None else chosen.reasoning_parser,
        tool_call_parser or chosen.tool_call_parser,
    )


def _none(value: str | None) -> str | None:
    return None if value is None or value.lower() == "none" else value
