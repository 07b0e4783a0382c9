"""Model family -> Miles ``--tito-model`` and the SGLang parsers it needs (docs/launcher.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from miles_nemogym.launcher._config import ConfigError


@dataclass(frozen=True)
class Parsers:
    """A model family's values for the command line: a Miles ``TITOTokenizerType`` and SGLang's parsers."""

    family: str
    tito_model: str
    reasoning_parser: str | None
    tool_call_parser: str
    patterns: tuple[str, ...] = field(default=(), compare=False)
    """Regular expressions matched against the lower-cased checkpoint name to detect the family."""


# The first family whose pattern matches wins (Qwen3-Next before Qwen3).
FAMILIES: tuple[Parsers, ...] = (
    Parsers("qwen3-next", "qwennext", "qwen3", "qwen25", (r"qwen3-next", r"qwen3-.*thinking-2507")),
    Parsers("qwen3.5", "qwen35", "qwen3", "qwen3_coder", (r"qwen3\.5",)),
    Parsers("qwen3", "qwen3", "qwen3", "qwen25", (r"qwen3(?![.\d])",)),
    Parsers("glm4.7", "glm47", "glm45", "glm47", (r"glm-?4\.7", r"glm-?5")),
    Parsers("nemotron3", "nemotron3", "nemotron_3", "qwen3_coder", (r"nemotron-?3",)),
    Parsers("kimi-k2.6", "kimi26", "kimi_k2", "kimi_k2_raw_id", (r"kimi-?k2\.6",)),
    Parsers("minimax-m2.5", "minimax_m25", "minimax-append-think", "minimax-m2", (r"minimax-?m2\.5",)),
    Parsers("minimax-m2.7", "minimax_m27", "minimax-append-think", "minimax-m2", (r"minimax-?m2\.7",)),
    Parsers("deepseek-v3.2", "deepseekv32", "deepseek-v3", "deepseekv32", (r"deepseek-v3\.2",)),
    Parsers("deepseek-v4", "deepseekv4", "deepseek-v4", "deepseekv4", (r"deepseek-v4",)),
    Parsers("inkling", "inkling", "inkling", "inkling", (r"inkling",)),
)
_BY_NAME = {family.family: family for family in FAMILIES}


class UnknownFamilyError(ConfigError):
    """The model family cannot be told; the message names the override flags."""


def detect(checkpoint: str) -> Parsers | None:
    """The family whose pattern matches the checkpoint's last path component, if any."""
    name = checkpoint.rstrip("/").rsplit("/", 1)[-1].lower()
    return next((f for f in FAMILIES if any(re.search(p, name) for p in f.patterns)), None)


def resolve(
    checkpoint: str,
    *,
    family: str | None = None,
    tito_model: str | None = None,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
) -> Parsers:
    """Family values with per-value overrides (reasoning parser ``none``: none); no known family: all three given."""
    known = ", ".join(_BY_NAME)
    chosen = detect(checkpoint) if family is None else _BY_NAME.get(family.lower())
    if chosen is None and family is not None:
        raise UnknownFamilyError(
            f"--model-family {family!r} is not one of: {known}; pass one of those, or set "
            "--tito-model, --reasoning-parser and --tool-call-parser yourself"
        )
    if chosen is None:
        given = (
            ("--tito-model", tito_model),
            ("--reasoning-parser", reasoning_parser),
            ("--tool-call-parser", tool_call_parser),
        )
        missing = [flag for flag, value in given if value is None]
        if missing:
            raise UnknownFamilyError(
                f"cannot tell the model family of {checkpoint!r} (known: {known}); pass --model-family, or all "
                f"of --tito-model, --reasoning-parser and --tool-call-parser (missing: {', '.join(missing)}; "
                "'--reasoning-parser none' for a model without reasoning output)"
            )
        chosen = Parsers("custom", "", None, "")
    reasoning = chosen.reasoning_parser if reasoning_parser is None else reasoning_parser
    return replace(
        chosen,
        tito_model=tito_model or chosen.tito_model,
        reasoning_parser=None if reasoning is None or reasoning.lower() == "none" else reasoning,
        tool_call_parser=tool_call_parser or chosen.tool_call_parser,
    )
