"""Model family -> --tito-model and SGLang parsers."""

from __future__ import annotations

import pytest

from miles_nemogym.launcher._families import FAMILIES, Parsers, UnknownFamilyError, detect, resolve


@pytest.mark.parametrize(
    ("checkpoint", "family"),
    [
        ("Qwen/Qwen3-4B-Instruct-2507", "qwen3"),
        ("/models/Qwen3-8B/", "qwen3"),
        ("Qwen/Qwen3-30B-A3B", "qwen3"),
        ("Qwen/Qwen3-4B-Thinking-2507", "qwen3-next"),
        ("Qwen/Qwen3-Next-80B-A3B-Thinking", "qwen3-next"),
        ("Qwen/Qwen3.5-9B", "qwen3.5"),
        ("zai-org/GLM-4.7-Flash", "glm4.7"),
        ("zai-org/GLM-5", "glm4.7"),
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B", "nemotron3"),
        ("moonshotai/Kimi-K2.6", "kimi-k2.6"),
        ("MiniMaxAI/MiniMax-M2.5", "minimax-m2.5"),
        ("MiniMaxAI/MiniMax-M2.7", "minimax-m2.7"),
        ("deepseek-ai/DeepSeek-V3.2", "deepseek-v3.2"),
        ("deepseek-ai/DeepSeek-V4-Flash", "deepseek-v4"),
    ],
)
def test_detect(checkpoint: str, family: str) -> None:
    found = detect(checkpoint)
    assert found is not None and found.family == family


@pytest.mark.parametrize(
    "checkpoint", ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B", "Qwen/Qwen3.6-27B", "moonshotai/Kimi-K2.5"]
)
def test_unknown_models_are_not_guessed(checkpoint: str) -> None:
    assert detect(checkpoint) is None
    with pytest.raises(UnknownFamilyError) as caught:
        resolve(checkpoint)
    message = str(caught.value)
    assert checkpoint in message
    for flag in ("--model-family", "--tito-model", "--reasoning-parser", "--tool-call-parser"):
        assert flag in message


def test_qwen3_values_are_miles_bindings() -> None:
    # miles/utils/chat_template_utils/tito_tokenizer.py: Qwen3TITOTokenizer
    parsers = resolve("Qwen/Qwen3-4B-Instruct-2507")
    assert (parsers.family, parsers.tito_model, parsers.reasoning_parser, parsers.tool_call_parser) == (
        "qwen3",
        "qwen3",
        "qwen3",
        "qwen25",
    )


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.family)
def test_each_family_is_chosen_by_its_name_and_by_a_checkpoint_named_after_it(family: Parsers) -> None:
    """No family shadows another: not by a repeated name (--model-family would reach the other)
    nor by an earlier pattern (detection would never reach it)."""
    by_flag = resolve("org/custom-model", family=family.family.upper())
    assert by_flag == Parsers(family.family, family.tito_model, family.reasoning_parser, family.tool_call_parser)
    assert by_flag.tool_call_parser  # SGLang gets one for every family
    assert resolve(f"org/{family.family}-7B") == by_flag


def test_explicit_family_beats_detection_and_overrides_beat_family() -> None:
    parsers = resolve("Qwen/Qwen3-4B", family="glm4.7")
    assert parsers.tito_model == "glm47"
    parsers = resolve("Qwen/Qwen3-4B", tool_call_parser="hermes", reasoning_parser="none")
    assert (parsers.tito_model, parsers.reasoning_parser, parsers.tool_call_parser) == ("qwen3", None, "hermes")


def test_unknown_family_name_is_an_error() -> None:
    with pytest.raises(UnknownFamilyError, match="--model-family 'llama'"):
        resolve("Qwen/Qwen3-4B", family="llama")


def test_custom_model_needs_all_three_values() -> None:
    with pytest.raises(UnknownFamilyError, match=r"missing: --reasoning-parser, --tool-call-parser"):
        resolve("org/custom", tito_model="default")
    parsers = resolve("org/custom", tito_model="default", reasoning_parser="none", tool_call_parser="hermes")
    assert (parsers.family, parsers.tito_model, parsers.reasoning_parser, parsers.tool_call_parser) == (
        "custom",
        "default",
        None,
        "hermes",
    )
