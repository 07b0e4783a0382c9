"""Wire models of NeMo-Gym's ``mini_swe_agent_2`` ``POST /run``.

Defined by nemo-gym 0.7.0 ``responses_api_agents/mini_swe_agent_2/app.py`` (docs/upstream.md).

The request side is strict where the server is strict: the server validates
``responses_create_params`` against a model that forbids unknown keys and answers 422
for the whole episode, so we validate the same way before sending and fail with a
message that names the key. The instance fields at the top level are free-form (the
server keeps unknown top-level keys and hands the whole body to the harness).

The response side is lenient: the server answers HTTP 200 even when the episode failed,
and older or newer servers may add or omit diagnostic fields. Only what the plugin
reads is parsed; everything else is ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr
from typing_extensions import TypedDict


class ResponsesCreateParams(BaseModel):
    """The ``responses_create_params`` the server accepts (nemo-gym's
    ``NeMoGymResponseCreateParamsNonStreaming``; ``extra="forbid"`` there too).

    The fields ``mini_swe_agent_2`` actually uses are typed; the rest of the server's
    schema is accepted untyped, so a task row carrying one is still sent as written.
    """

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
    """One item of the trajectory; only its type is read (to count turns and tool calls).

    A TypedDict, not a model: a dict per item validates ~7x faster than a model instance,
    which matters for a runaway trajectory of a million items (bench/agent_bench.py)."""

    type: str | None


class ResponseObject(BaseModel):
    """The part of the Responses object in a ``/run`` result that the plugin reads."""

    model_config = ConfigDict(extra="ignore")

    output: list[OutputItem] = Field(default_factory=list)


class RunResponse(BaseModel):
    """A ``/run`` result (nemo-gym's ``BaseVerifyResponse`` + ``mini_swe_agent_2``'s fields).

    Unread parts (the echoed prompt, the trajectory's contents) are ignored rather than
    kept: they are most of a result's bytes, and building Python objects for them that
    are dropped at once measurably taxes the garbage collector of the rollout loop
    (bench/agent_bench.py). The trajectory itself stays in the server's results folder.
    """

    model_config = ConfigDict(extra="ignore")

    reward: Any
    """A number in valid results; checked by the classifier (a string or a boolean is
    not a reward, though pydantic would coerce either to a float)."""
    instance_id: str | None = None
    metadata: dict[str, Any] | None = None
    """Graded: ``{instance_id, model_patch, eval_report}``; crashed: ``{error, traceback}``."""
    response: ResponseObject | None = None
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None
