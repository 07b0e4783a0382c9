"""A task row's ``responses_create_params`` as a chat-completions request. Pure functions.

The conversion follows NeMo-Gym 0.7.0's own Responses -> Chat Completions converter
(``nemo_gym/responses_converter.py``, used by its ``vllm_model`` server in front of the
policy): ``instructions`` becomes the leading system message, a Responses function tool
``{type, name, description, parameters, strict}`` becomes ``{type: "function", function:
{...}}``, ``max_output_tokens`` becomes ``max_tokens``. Miles' sampling keys win over the
row's: ``temperature``, ``top_p``, ``max_tokens`` typed, the rest sent as top-level body
keys (what an OpenAI client's ``extra_body`` does, as the SWE path's harness sends them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from miles_nemogym.errors import MilesNemoGymError

# Row keys with a chat-completions home, under their chat name.
_ROW_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens"}
_PASSED = ("parallel_tool_calls", "tool_choice")


class RowError(MilesNemoGymError, ValueError):
    """The task row cannot become a chat-completions request; the message names the field."""


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for index, part in enumerate(content):
            if isinstance(part, Mapping) and part.get("type") in ("input_text", "output_text", "text"):
                parts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise RowError(f"{where}[{index}] is a {kind!r} part; only text parts are supported")
        return "".join(parts)
    raise RowError(f"{where} must be a string or a list of text parts, got {type(content).__name__}")


def messages(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of ``responses_create_params.input`` (+ ``instructions``)."""
    raw = params.get("input", [])
    items: list[Any] = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    if not isinstance(items, list):
        raise RowError("responses_create_params.input must be a string or a list of messages")
    out: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        where = f"responses_create_params.input[{index}]"
        if not isinstance(item, Mapping) or item.get("type", "message") != "message" or "role" not in item:
            raise RowError(f"{where} must be a message {{role, content}}; other input item types are not supported")
        out.append({"role": str(item["role"]), "content": _text(item.get("content", ""), f"{where}.content")})
    instructions = params.get("instructions")
    if instructions:
        leading = [str(instructions)]
        while out and out[0]["role"] in ("system", "developer"):
            leading.append(out.pop(0)["content"])
        out.insert(0, {"role": "system", "content": "\n\n".join(leading)})
    return out


def tools(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``responses_create_params.tools`` (Responses function tools) as chat-completions tools."""
    raw = params.get("tools") or []
    if not isinstance(raw, list):
        raise RowError("responses_create_params.tools must be a list")
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(raw):
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise RowError(
                f"responses_create_params.tools[{index}] must be a function tool {{type: 'function', name, ...}}"
            )
        function = {k: v for k, v in tool.items() if k not in ("type", "defer_loading") and v is not None}
        out.append({"type": "function", "function": function})
    return out


def request_body(params: Mapping[str, Any], request_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The first chat-completions body (without ``messages``): tools, and the sampling keys
    of the row overridden by Miles' ``request_kwargs`` (None values mean "not set")."""
    body: dict[str, Any] = {}
    for row_key, chat_key in _ROW_SAMPLING.items():
        if params.get(row_key) is not None:
            body[chat_key] = params[row_key]
    row_extra = (params.get("metadata") or {}).get("extra_body")
    if row_extra is not None:
        try:
            extra = json.loads(row_extra) if isinstance(row_extra, str) else dict(row_extra)
        except (ValueError, TypeError) as error:
            raise RowError(f"responses_create_params.metadata.extra_body must be a JSON object: {error}") from None
        if not isinstance(extra, dict):
            raise RowError("responses_create_params.metadata.extra_body must be a JSON object")
        body.update(extra)
    chat_tools = tools(params)
    if chat_tools:
        body["tools"] = chat_tools
        body.update({key: params[key] for key in _PASSED if params.get(key) is not None})
    body.update({key: value for key, value in (request_kwargs or {}).items() if value is not None})
    body.pop("stream", None)
    return body
