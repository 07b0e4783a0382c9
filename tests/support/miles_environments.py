"""NeMo-Gym environment rows and scripted Qwen3 completions for Miles' rollout step.

``prompt_row`` writes a resources-server task row as a Miles ``--prompt-data`` row (the
prompt is the row's input messages, the row itself the metadata, marked with its
environment), tagged so the harness' mock SGLang engine answers its model calls with the
script of that name (``MilesDriver.step(scripts=...)``). ``completion`` renders a scripted
turn as the raw text a Qwen3 model generates: what the engine's ``qwen25`` tool-call parser
turns into ``tool_calls``, byte for byte what Miles' chat template renders for that
message again (so the session server's TITO check sees no mismatch).
"""

from __future__ import annotations

import json
from typing import Any

from miles_nemogym.episode.record import ENV_KEY, TASK_ID_KEY
from tests.support import env_scripts
from tests.support.env_scripts import ENVIRONMENTS
from tests.support.scripted_chat import Turn, tagged

MAX_STEPS = {"workplace_assistant": 6}
"""``max_steps`` of each environment's shipped ``simple_agent`` config (the others set none)."""
__all__ = ["ENVIRONMENTS", "MAX_STEPS", "completion", "prompt_row", "scripts"]
END = "<|im_end|>"


def prompt_row(env: str, row: dict[str, Any], script: str) -> dict[str, Any]:
    """``row`` of environment ``env`` as a Miles prompt row, its model calls scripted by ``script``."""
    task = tagged(row, script)
    params = task["responses_create_params"]
    instructions = [{"role": "system", "content": params["instructions"]}] if params.get("instructions") else []
    messages = [{"role": m["role"], "content": m["content"]} for m in params["input"]]
    return {"prompt": instructions + messages, "metadata": {**task, ENV_KEY: env, TASK_ID_KEY: f"{env}/{script}"}}


def completion(turn: Turn) -> str:
    """The raw Qwen3 text of ``turn``: its content, then one ``<tool_call>`` block per call.

    Arguments are written as SGLang's parser writes them back (``json.dumps``, non-ASCII kept).
    Every turn ends with ``<|im_end|>``, as a real model's does (the harness' engine trims it
    from the message text, as SGLang does)."""
    calls = [
        f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(json.loads(arguments), ensure_ascii=False)}}}\n'
        "</tool_call>"
        for name, arguments in turn.tool_calls
    ]
    return "\n".join(([turn.content] if turn.content else []) + calls) + END


def scripts(env: str, row: dict[str, Any]) -> dict[str, list[Turn]]:
    """``env``'s gold and wrong scripts for ``row`` (``tests/support/env_scripts.py``), written
    with thinking off as the step's chat template has it: with ``<think>`` spans in the text, the
    model's tokens would not be the template's rendering of its turn (mock engine: no reasoning parser)."""
    found = env_scripts.scripts(env, row)
    return {outcome: env_scripts.without_thinking(found[outcome]) for outcome in ("gold", "wrong")}
