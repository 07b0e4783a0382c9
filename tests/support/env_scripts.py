"""Scripted gold and wrong policies for the first example row of each NeMo-Gym environment
run here, shared by the loop's own tests and those through Miles' rollout step."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.support.scripted_chat import Turn, tool

ENVIRONMENTS = (
    "mcqa",
    "workplace_assistant",
    "example_multi_step",
    "xlam_fc",
    "equivalence_rule",
    "math_with_judge",
    "code_gen",
)
"""The 0.7.0 environments with scripts here (no network, keys or judge)."""
SMOKED = ("calendar", "calendar_v2", "arc_agi")
"""Environments (beyond ``ENVIRONMENTS``) that ``smoke --env`` plays end to end in the integration
tests, with the gold and wrong answers of ``miles_nemogym.smoke._answers``."""
BENCHMARKS = ("aime25", "gsm8k")
"""Benchmarks ``tests/integration/test_benchmarks.py`` converts from a prepared file and grades
through ``agent.run`` (``aime25`` through Miles' eval step too), on ``math_with_judge``."""
JUDGED_BENCHMARKS = ("aegis_v4_safety",)
"""The benchmark whose data the wheel ships, converted by name alone and graded through
``agent.run`` by its grader (the environment of the same name, served with the stand-in judge of
``tests/support/judge_model.py``) in ``tests/integration/test_benchmarks.py``."""
OWN_CONFIG_BENCHMARKS = ("gpqa",)
"""Benchmarks whose config changes their grader that ``tests/integration/test_benchmarks.py``
serves by their own names (``serve --env gpqa``) and grades through ``agent.run``."""
_THINKING = re.compile(r"<think>.*?</think>", re.DOTALL)

# code_gen's first example row (Codeforces 1259D): reverse the fewest words so that they
# chain; a correct program for its unit test, and one that never reverses anything.
_WORDS_GOLD = """import sys

def main():
    data = sys.stdin.read().split()
    t, pos, out = int(data[0]), 1, []
    for _ in range(t):
        n = int(data[pos])
        words = data[pos + 1 : pos + 1 + n]
        pos += 1 + n
        present = set(words)
        zero_one = [i for i, w in enumerate(words) if w[0] == "0" and w[-1] == "1"]
        one_zero = [i for i, w in enumerate(words) if w[0] == "1" and w[-1] == "0"]
        if not zero_one and not one_zero:
            both = any(w[0] == w[-1] == "0" for w in words) and any(w[0] == w[-1] == "1" for w in words)
            out += ["-1"] if both else ["0", ""]
            continue
        more, fewer = sorted((zero_one, one_zero), key=len, reverse=True)
        need = (len(more) - len(fewer)) // 2
        picks = [i + 1 for i in more if words[i][::-1] not in present][:need]
        out += [str(len(picks)), " ".join(map(str, picks))]
    print("\\n".join(out))

main()
"""
_WORDS_WRONG = """import sys

data = sys.stdin.read().split()
print("\\n".join("0\\n" for _ in range(int(data[0]))))
"""


def scripts(env: str, row: dict[str, Any]) -> dict[str, list[Turn]]:
    """A gold (reward 1.0) and a wrong (0.0) policy for ``row``, ``env``'s first example row
    (some environments add a case of their own); see docs/environments.md for what each verifier reads."""
    if env == "mcqa":
        return {
            "gold": [Turn(content="<think>PCR detects the mutation.</think>The answer is \\boxed{B}")],
            "wrong": [Turn(content="<think>Karyotyping?</think>\\boxed{A}")],
            "thinking_only": [Turn(content="<think>\\boxed{B}</think>")],
        }
    if env == "workplace_assistant":
        reply = json.loads(row["ground_truth"][0]["arguments"])
        look = tool("email_search_emails", query="Task Update on Develop prototype for report generation")
        return {
            "gold": [
                Turn(content="<think>Find it first.</think>", tool_calls=(look,)),
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
            "gold": [
                Turn(tool_calls=lookups),
                Turn(tool_calls=(tool("extract_synonym_values", synonym_values=values),)),
                Turn(content="Done."),
            ],
            "wrong": [
                Turn(tool_calls=lookups),
                Turn(tool_calls=(tool("extract_synonym_values", synonym_values=values[::-1]),)),
                Turn(content="Done."),
            ],
        }
    if env == "equivalence_rule":  # graded "exact" on the message text (its shipped lc.yaml)
        return {
            "gold": [Turn(content=f"<think>Count them.</think>{row['expected_answer']}")],
            "wrong": [Turn(content=row["expected_answer"][::-1])],
        }
    if env == "math_with_judge":  # math-verify on the message text; the shipped config has the judge off
        return {
            "gold": [Turn(content=f"<think>Casework.</think>There are \\boxed{{{row['expected_answer']}}} of them.")],
            "wrong": [Turn(content=f"\\boxed{{{int(row['expected_answer']) + 1}}}")],
        }
    if env == "code_gen":  # runs the last ```python block of output_text on the row's unit tests
        return {
            "gold": [Turn(content=f"<think>Balance 01- and 10-words.</think>```python\n{_WORDS_GOLD}```")],
            "wrong": [Turn(content=f"```python\n{_WORDS_WRONG}```")],
            # An unclosed <think> stays in output_text: the reasoning-format penalty (0.0), gold code or not.
            "think_leak": [Turn(content=f"<think>Balance them.\n```python\n{_WORDS_GOLD}```")],
        }
    assert env == "xlam_fc"
    calls = tuple(tool(answer["name"], **answer["arguments"]) for answer in row["expected_answers"])
    return {
        "gold": [Turn(tool_calls=calls), Turn(content="Here they are.")],
        "wrong": [Turn(tool_calls=calls[:1]), Turn(content="Here they are.")],
    }


def without_thinking(turns: list[Turn]) -> list[Turn]:
    """``turns`` as a policy with thinking off writes them: no ``<think>...</think>`` spans."""
    return [
        Turn(content=_THINKING.sub("", t.content) if t.content else t.content, tool_calls=t.tool_calls) for t in turns
    ]
