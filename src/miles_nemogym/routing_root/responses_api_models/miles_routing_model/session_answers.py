"""The one rule for a Miles session's HTTP error answer, on both paths: the in-process loop
(``episode/environment.py``) and the routing model (``app.py``). A 400 whose body says "context
length" (vLLM's "maximum context length", SGLang's "longer than the model's context length") is
the conversation outgrowing the context: a cut-off, answered as NeMo-Gym's ``vllm_model`` answers
it (an empty turn, ``finish_reason: length``). Every other error answer, a 400 saying
"max_tokens must be ..." included, fails the episode. Standard library only (both venvs)."""

from __future__ import annotations

import re

__all__ = ["CONTEXT_FULL", "is_context_overflow"]

CONTEXT_FULL = re.compile(rb"context length", re.IGNORECASE)
"""What a 400's body says when the prompt leaves no room to generate (the in-process loop reads it
directly: a constant costs its sample path no file)."""


def is_context_overflow(status: int, body: bytes) -> bool:
    """Whether a session's answer ``status``/``body`` says the prompt leaves no room to generate."""
    return status == 400 and CONTEXT_FULL.search(body) is not None
