"""Wire models of what the loop reads: a chat-completions answer and a ``/verify`` answer.

Only the fields the loop uses are typed; the rest is kept (``extra="allow"``) or ignored.
The chat answer is what an OpenAI-compatible server (Miles' session server) sends; the
verify answer is NeMo-Gym 0.7.0's ``BaseVerifyResponse`` (``nemo_gym/base_resources_server.py``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr


class FunctionCall(BaseModel):
    """``tool_calls[].function``: arguments stay the raw string the model wrote."""

    name: StrictStr
    arguments: StrictStr = ""


class ToolCall(BaseModel):
    id: StrictStr
    type: str = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    message: AssistantMessage
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    """One non-streamed chat-completions answer; ``choices[0]`` is the turn."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    model: str | None = None
    created: int | None = None
    choices: list[Choice] = Field(min_length=1)


class VerifyAnswer(BaseModel):
    """A ``/verify`` answer: the reward, NeMo-Gym's masking fields, and every other field the
    environment adds (kept for the record)."""

    model_config = ConfigDict(extra="allow")

    reward: float = Field(allow_inf_nan=False)
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None

    def extras(self) -> dict[str, Any]:
        """The environment's own fields (``model_extra``), e.g. mcqa's ``extracted_answer``."""
        return dict(self.model_extra or {})
