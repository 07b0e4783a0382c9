"""An episode's turns, kept twice: as the chat history sent back to the policy, and as the
Responses-format output items ``/verify`` reads.

The items are those NeMo-Gym 0.7.0's ``simple_agent`` hands ``/verify`` when its model
server (``vllm_model``) converts each chat answer (``nemo_gym/responses_converter.py``,
``postprocess_assistant_message_dict``): per turn a ``reasoning`` item when ``<think>...</think>``
spans are in the content, a ``message`` item with the rest of the text (also when the turn is
empty), one ``function_call`` per tool call, then one ``function_call_output`` per call.
Verifiers depend on this shape: ``workplace_assistant`` reads the ``function_call`` items,
``example_multi_step`` the last one, ``mcqa`` the response's ``output_text``,
``instruction_following`` ``output[-1].content[0].text``.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from miles_nemogym.simple_agent.wire import AssistantMessage

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)

# responses_create_params fields NeMo-Gym copies onto the Response it builds.
_COPIED = ("temperature", "top_p", "max_output_tokens", "instructions", "metadata", "text", "reasoning", "user")


def _assistant_items(message: AssistantMessage) -> list[dict[str, Any]]:
    content = message.content or ""
    thoughts = _THINK.findall(content)
    text = _THINK.sub("", content)
    calls = message.tool_calls or []
    items: list[dict[str, Any]] = []
    if thoughts:
        items.append(
            {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": thought} for thought in thoughts],
                "status": "completed",
            }
        )
    if text or not (thoughts or calls):
        items.append(
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call in calls:
        items.append(
            {
                "id": call.id,
                "type": "function_call",
                "call_id": call.id,
                "name": call.function.name,
                "arguments": call.function.arguments,
                "status": "completed",
            }
        )
    return items


class Transcript:
    """The conversation so far; ``add_turn`` / ``add_tool_output`` in order, then ``response``."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        """The chat history: the row's input, then each turn exactly as the policy wrote it."""
        self.output: list[dict[str, Any]] = []
        self.turns = 0
        self.tool_calls = 0
        self.model: str | None = None
        self._last_turn_answered = True

    def add_turn(self, message: AssistantMessage, model: str | None) -> None:
        entry: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            entry["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        self.messages.append(entry)
        items = _assistant_items(message)
        self._last_turn_answered = any(item["type"] != "reasoning" for item in items)
        self.output.extend(items)
        self.turns += 1
        self.model = model or self.model

    def add_tool_output(self, call_id: str, output: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        self.output.append({"type": "function_call_output", "call_id": call_id, "output": output})
        self.tool_calls += 1

    def response(self, params: Mapping[str, Any], *, cut_off: bool) -> dict[str, Any]:
        """The Responses-format ``response`` for ``/verify`` (NeMo-Gym's ``NeMoGymResponse``).

        ``incomplete`` when cut off, or, as ``simple_agent`` marks it, when the last turn was
        reasoning only (``metadata.ng_termination_reason``)."""
        thinking_only = not cut_off and not self._last_turn_answered
        response: dict[str, Any] = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": float(int(time.time())),
            "model": self.model or params.get("model") or "policy",
            "output": self.output,
            "tools": list(params.get("tools") or []),
            "tool_choice": params.get("tool_choice") or "auto",
            "parallel_tool_calls": params.get("parallel_tool_calls", True),
            "status": "incomplete" if cut_off or thinking_only else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut_off else None,
        }
        response.update({key: params[key] for key in _COPIED if params.get(key) is not None})
        if thinking_only:
            response["metadata"] = {**(response.get("metadata") or {}), "ng_termination_reason": "incomplete_reasoning"}
        return response
