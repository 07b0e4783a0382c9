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
from tests.support.scripted_chat import Turn, tagged, tool

ENVIRONMENTS = ("mcqa", "workplace_assistant", "example_multi_step", "xlam_fc", "equivalence_rule")
"""The 0.7.0 environments run here (no network, keys or judge)."""
MAX_STEPS = {"workplace_assistant": 6}
"""``max_steps`` of each environment's shipped ``simple_agent`` config (the others set none)."""
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
    """A gold (reward 1.0) and a wrong (0.0) policy for ``row`` of ``env``.

    Each reads its gold answer from the row; see docs/environments.md for what each verifier reads."""
    if env == "mcqa":
        gold = row["expected_answer"]
        wrong = "A" if gold != "A" else "B"
        return {
            "gold": [Turn(content=f"PCR finds it. The answer is \\boxed{{{gold}}}")],
            "wrong": [Turn(content=f"\\boxed{{{wrong}}}")],
        }
    if env == "workplace_assistant":
        reply = json.loads(row["ground_truth"][0]["arguments"])
        look = tool("email_search_emails", query="Task Update on Develop prototype for report generation")
        return {
            "gold": [
                Turn(content="Find the email first.", tool_calls=(look,)),
                Turn(tool_calls=(tool("email_reply_email", **reply),)),
                Turn(content="Replied."),
            ],
            "wrong": [
                Turn(tool_calls=(look,)),
                Turn(tool_calls=(tool("email_reply_email", email_id=reply["email_id"], body="No."),)),
                Turn(content="Replied."),
            ],
        }
    if env == "example_multi_step":
        values = row["expected_synonym_values"]
        lookups = tuple(tool("get_synonym_value", synonym=s) for s in row["expected_synonyms"])
        return {
            outcome: [
                Turn(tool_calls=lookups),
                Turn(tool_calls=(tool("extract_synonym_values", synonym_values=answer),)),
                Turn(content="Done."),
            ]
            for outcome, answer in (("gold", values), ("wrong", values[::-1]))
        }
    if env == "xlam_fc":
        calls = tuple(tool(answer["name"], **answer["arguments"]) for answer in row["expected_answers"])
        return {
            "gold": [Turn(tool_calls=calls), Turn(content="Here they are.")],
            "wrong": [Turn(tool_calls=calls[:1]), Turn(content="Here they are.")],
        }
    if env == "equivalence_rule":  # graded "exact" on the message text (its shipped lc.yaml)
        return {"gold": [Turn(content=row["expected_answer"])], "wrong": [Turn(content=row["expected_answer"][::-1])]}
    raise ValueError(f"no scripts for environment {env!r}")
