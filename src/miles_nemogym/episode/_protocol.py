"""Wire models of NeMo-Gym's ``mini_swe_agent_2`` ``POST /run``.

Defined by nemo-gym 0.7.0 ``responses_api_agents/mini_swe_agent_2/app.py``. The request
side is strict where the server is strict (it answers 422 for an unknown
``responses_create_params`` key); the response side parses only what the classifier reads.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr
from typing_extensions import TypedDict

__all__ = ["OutputItem", "ResponsesCreateParams", "RunRequest", "RunResponse"]


class ResponsesCreateParams(BaseModel):
    """The ``responses_create_params`` the server accepts (nemo-gym's
    ``NeMoGymResponseCreateParamsNonStreaming``, ``extra="forbid"``): the fields
    ``mini_swe_agent_2`` uses typed, the rest of the server's schema untyped."""

    model_config = ConfigDict(extra="forbid")

    input: str | list[Any] = Field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    parallel_tool_calls: bool | None = None
    tool_choice: str | dict[str, Any] | None = None
    metadata: dict[str, StrictStr] | None = None
    """Free-form ``dict[str, str]``. ``extra_body`` (a JSON object as a string) is merged
    into every chat-completions request the harness sends; ``chat_template_kwargs``
    (JSON string) goes inside it."""

    # Accepted by the server's schema, unused by mini_swe_agent_2.
    background: bool | None = None
    include: list[Any] | None = None
    instructions: str | None = None
    max_tool_calls: int | None = None
    model: str | None = None
    previous_response_id: str | None = None
    prompt: Any = None
    reasoning: Any = None
    service_tier: str | None = None
    store: bool | None = None
    context_management: list[Any] | None = None
    conversation: Any = None
    moderation: Any = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    stream_options: Any = None
    text: Any = None
    tools: list[Any] | None = None
    truncation: str | None = None
    user: str | None = None
    stream: bool | None = None


class RunRequest(BaseModel):
    """The ``/run`` body: the task instance at the top level plus the routing fields."""

    model_config = ConfigDict(extra="allow")

    instance_id: StrictStr = Field(min_length=1)
    responses_create_params: ResponsesCreateParams
    policy_base_url: str | None = None
    policy_api_key: str | None = Field(default=None, repr=False)
    subset: str | None = None
    split: str | None = None


class OutputItem(TypedDict, total=False):
    """One item of the trajectory; only its type and role are read (to count turns and tool calls).

    A TypedDict, not a model: a dict per item validates much faster than a model instance,
    which matters for a runaway trajectory of a million items."""

    type: str | None
    role: str | None


class _ResponseObject(BaseModel):
    """The part of the Responses object in a ``/run`` result that the plugin reads."""

    model_config = ConfigDict(extra="ignore")

    output: list[OutputItem] = Field(default_factory=list)


class RunResponse(BaseModel):
    """A ``/run`` result (nemo-gym's ``BaseVerifyResponse`` + ``mini_swe_agent_2``'s fields).
    Unread parts (the echoed prompt, the trajectory's contents: most of the bytes) are not
    built into objects, which would tax the rollout loop's garbage collector."""

    model_config = ConfigDict(extra="ignore")

    reward: Any
    """A number in valid results; checked by the classifier (a string or a boolean is
    not a reward, though pydantic would coerce either to a float)."""
    instance_id: str | None = None
    metadata: dict[str, Any] | None = None
    """Graded: ``{instance_id, model_patch, eval_report}``; crashed: ``{error, traceback}``."""
    response: _ResponseObject | None = None
    mask_sample: Any = False
    """A boolean in valid results; checked by the classifier (``"false"`` or ``0`` is no answer)."""
    failure_kind: Any = None
    """A kind name in valid results; checked by the judge, as ``mask_sample`` is."""
    failure_reason: Any = None
