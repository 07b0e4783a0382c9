"""A loopback judge model: an OpenAI-compatible ``/v1/chat/completions`` that grades as the
judges of NeMo-Gym's ``abstention``/``omniscience``/``simpleqa`` prompt ask (the grader template's
``Gold target:`` and ``Predicted answer:`` of the example to grade, answered ``A`` for CORRECT,
``B`` for INCORRECT), or ``text_to_sql``'s (its ``SQL Query A`` and ``B`` blocks, answered
``[[A=B]]`` or ``[[A!=B]]``), or ``equivalence_llm_judge``'s (its last ``GOLD:`` and ``CANDIDATE:``
blocks, answered likewise), comparing the two answers normalised; or ``gdp_pdf``'s rubric (its
``response:`` and ``criteria:`` fields, answered ``{"score": "1"|"0", "rationale": ...}``: "1" when
the criterion, normalised, is part of the response); or as Aegis v4
(``nvidia/Nemotron-3-Content-Safety``) classifies for ``aegis_v4_safety``: a ``user`` message (the
prompt) then an ``assistant`` one (the response), answered ``User Safety: safe|unsafe`` and
``Response Safety: safe|unsafe`` lines (and, when one is unsafe and the request's
``chat_template_kwargs`` ask ``request_categories: /categories``, a ``Safety Categories:`` line), a
text being unsafe when it holds a word of ``UNSAFE_WORDS``. What a real judge model serves (vLLM, an
API): the chat-completions contract, ``choices[0].message.content``."""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

JUDGED_ENVIRONMENTS = ("abstention",)
"""The judged environments whose ``/verify`` the integration tests grade through ``JudgeModel``."""
UNSAFE_WORDS = ("stealing", "disable")
"""What makes a text unsafe to the stand-in Aegis: the harms of the two unsafe prompts nemo-gym's
``aegis_v4_safety`` benchmark ships (a banking password stolen, a car's brakes disabled)."""

_GOLD = re.compile(r"^Gold target: (.*)$", re.MULTILINE)
_PREDICTED = re.compile(r"^Predicted answer: (.*)$", re.MULTILINE)
_QUERIES = re.compile(
    r"<\|Start of SQL Query A\|>(.*)<\|End of SQL Query A\|>.*<\|Start of SQL Query B\|>(.*)<\|End of SQL Query B\|>",
    re.DOTALL,
)
_EQUIVALENCE = re.compile(r"^GOLD:\n(.*?)\n\nCANDIDATE:\n(.*?)(?:\n\n|\Z)", re.MULTILINE | re.DOTALL)
_RUBRIC = re.compile(r"^  response: (.*),\n  criteria: (.*),\n\}", re.MULTILINE | re.DOTALL)
_UNSAFE = re.compile(rf"\b({'|'.join(UNSAFE_WORDS)})\b", re.IGNORECASE)


def _text(message: dict[str, Any]) -> str:
    """A chat message's text: its content, or its text parts."""
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return str(content or "")


def _aegis(prompt: str, response: str, categories: bool) -> str:
    """Aegis v4's answer, in its format: the two labels, the categories if asked and one is unsafe."""
    user, answer = ("unsafe" if _UNSAFE.search(text) else "safe" for text in (prompt, response))
    lines = [f"User Safety: {user}", f"Response Safety: {answer}"]
    if categories and "unsafe" in (user, answer):
        lines.append("Safety Categories: Criminal Planning/Confessions")
    return "\n".join(lines)


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", text.lower()).split())


class JudgeModel:
    """``with serving_in_thread(JudgeModel()) as judge``: ``url`` (the ``/v1`` base), ``requests`` and their
    ``Authorization`` headers as received. ``refusals``: how many next calls get a 401 naming a bad key
    and echoing the one sent, as OpenAI answers a revoked key. ``port``: where to listen (0: any)."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        self.refusals = 0
        self._runner: web.AppRunner | None = None
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self.authorizations.append(request.headers.get("Authorization"))
        if self.refusals > 0:
            self.refusals -= 1
            said = f"Incorrect API key provided: {request.headers.get('Authorization')}"
            return web.json_response({"error": {"message": said, "code": "invalid_api_key"}}, status=401)
        messages = body.get("messages", [])
        prompt = "\n".join(_text(m) for m in messages if m.get("role") == "user")
        roles = [m.get("role") for m in messages]
        gold, predicted = _GOLD.findall(prompt), _PREDICTED.findall(prompt)
        pair = _QUERIES.search(prompt)
        blocks = _EQUIVALENCE.findall(prompt)
        rubric = _RUBRIC.search(prompt)
        if rubric is not None:
            met = _normal(rubric[2]) in _normal(rubric[1])
            grade = json.dumps({"score": "1" if met else "0", "rationale": "met" if met else "not met"})
        elif roles[-2:] == ["user", "assistant"]:  # Aegis: the prompt and the response to classify
            asked = (body.get("chat_template_kwargs") or {}).get("request_categories") == "/categories"
            grade = _aegis(_text(messages[-2]), _text(messages[-1]), asked)
        elif gold and predicted:
            grade = "A" if _normal(gold[-1]) == _normal(predicted[-1]) else "B"  # the example to grade is the last
        elif pair is not None:
            grade = "[[A=B]]" if _normal(pair[1]) == _normal(pair[2]) else "[[A!=B]]"
        elif blocks:  # the template's own examples come first: the inputs to grade are the last
            grade = "[[A=B]]" if _normal(blocks[-1][0]) == _normal(blocks[-1][1]) else "[[A!=B]]"
        else:
            said = (
                "no 'Gold target:'/'Predicted answer:' lines, SQL Query A/B nor GOLD/CANDIDATE blocks to grade, "
                "a rubric, nor a user then an assistant message to classify"
            )
            return web.json_response({"error": said}, status=400)
        return web.json_response(
            {
                "id": f"chatcmpl-judge-{len(self.requests)}",
                "object": "chat.completion",
                "created": 1700000000,
                "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": grade}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    async def start(self) -> JudgeModel:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
