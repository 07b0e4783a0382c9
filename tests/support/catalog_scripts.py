"""Gold (reward 1.0) and wrong (0.0) scripted answers for the first example row of more
catalog environments, all served by one ``serve --env`` start in
``tests/integration/test_catalog_envs.py``; each answer follows what that environment's
``/verify`` reads (docs/environments.md, "Catalog coverage")."""

from __future__ import annotations

import json
from typing import Any

from tests.support.scripted_chat import Turn, tag, tool

SERVED_TOGETHER = (
    "bunsenbench_chemistry_mcq",
    "gpqa_diamond",
    "hotpotqa_qa",
    "lc_niah",
    "ruler",
    "spartqa",
    "ragtruth",
    "imo_gradingbench",
    "math_proof_judgement",
    "proof_genselect",
    "example_session_state_mgmt",
    "math_advanced_calculations",
    "string_match",
    "graphwalks",
    "mrcr",
    "ruler2",
    "polymath",
    "math_with_code",
    "iheval",
    "swerl_llm_judge",
    "fukuyamabench",
    "indirect_prompt_injection",
    "reasoning_gym",
    "example_single_tool_call",
)
"""Catalog environments (``simple_agent``, no network, key or judge) played end to end in one
server start by ``tests/integration/test_catalog_envs.py``."""
JUDGED_TOGETHER = ("simpleqa", "omniscience", "text_to_sql", "equivalence_llm_judge")
"""Judged catalog environments served in the same start, graded through the stand-in judge of
``tests/support/judge_model.py``."""


def tagged(row: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of ``row`` whose last input message carries script ``name``'s tag, its content a
    string or a list of ``input_text`` parts."""
    params = json.loads(json.dumps(row["responses_create_params"]))
    last = params["input"][-1]
    if isinstance(last["content"], list):
        last["content"].append({"type": "input_text", "text": tag(name)})
    else:
        last["content"] = f"{last['content']}\n{tag(name)}"
    return {**row, "responses_create_params": params}


def _say(gold: str, wrong: str) -> dict[str, list[Turn]]:
    return {"gold": [Turn(content=gold)], "wrong": [Turn(content=wrong)]}


def _choice(row: dict[str, Any], letter: str) -> str:
    return str(next(option[letter] for option in row["options"] if letter in option))


def scripts(env: str, row: dict[str, Any]) -> dict[str, list[Turn]]:
    """A gold and a wrong policy for ``row``, ``env``'s first example row."""
    if env == "bunsenbench_chemistry_mcq":  # the choice's text in <choice> tags
        wrong = next(letter for option in row["options"] for letter in option if letter != row["expected_answer"])
        right = _choice(row, row["expected_answer"])
        return _say(f"<choice>{right}</choice>", f"<choice>{_choice(row, wrong)}</choice>")
    if env == "gpqa_diamond":  # strict_single_letter_boxed
        wrong = "A" if row["expected_answer"] != "A" else "B"
        return _say(f"Answer: \\boxed{{{row['expected_answer']}}}", f"Answer: \\boxed{{{wrong}}}")
    if env == "hotpotqa_qa":
        return _say(json.dumps({"answer": row["expected_answer"]}), json.dumps({"answer": "maybe"}))
    if env in ("lc_niah", "graphwalks"):  # the last line, 'Final Answer: [...]'
        nodes = ", ".join(json.loads(row["expected_answer"]))
        return _say(f"Walking the edges.\nFinal Answer: [{nodes}]", "Final Answer: [nowhere]")
    if env == "ruler":  # every expected output in the text
        return _say(", ".join(row["outputs"]), "No variable holds that value.")
    if env == "spartqa":
        wrong = next(o for o in row["options"] if o != row["target"])
        return _say(f"Answer: {row['target']}", f"Answer: {wrong}")
    if env == "ragtruth":  # a hallucination found or not, as the row's is_halu says
        found, none = json.dumps({"hallucination list": ["in 1492"]}), json.dumps({"hallucination list": []})
        return _say(found, none) if row["is_halu"] else _say(none, found)
    if env == "imo_gradingbench":  # the grade as the last word
        wrong = "incorrect" if row["expected_answer"] != "incorrect" else "correct"
        return _say(f"The proof holds.\n{row['expected_answer']}", f"The proof has a gap.\n{wrong}")
    if env == "math_proof_judgement":
        judgement = row["expected_judgement"]
        wrong = "Judgement: No" if judgement.endswith("Yes") else "Judgement: Yes"
        return _say(f"Checked each step.\n{judgement}", f"Checked each step.\n{wrong}")
    if env == "proof_genselect":
        best, other = row["correct_index"], 3 - row["correct_index"]
        tail = "<analysis>Compared both.</analysis>\n<best_solution>{}</best_solution>"
        return _say(tail.format(best), tail.format(other))
    if env == "example_session_state_mgmt":  # the session's counter must end at expected_count
        step = row["expected_count"] - row["initial_count"]
        return {
            "gold": [Turn(tool_calls=(tool("increment_counter", count=step),)), Turn(content="Done.")],
            "wrong": [Turn(tool_calls=(tool("increment_counter", count=step + 1),)), Turn(content="Done.")],
        }
    if env == "math_advanced_calculations":  # every ground-truth value among the tools' outputs
        calls = (
            tool("subtract", a=9.0, b=9.0),
            tool("divide", a=1.0, b=1.0),
            tool("multiply", a=1.0, b=9.0),
            tool("sin", radians=5.0),
        )
        return {
            "gold": [Turn(tool_calls=calls), Turn(content="Here they are.")],
            "wrong": [Turn(tool_calls=calls[:3]), Turn(content="Here they are.")],
        }
    if env == "string_match":  # boxed, case ignored
        return _say(f"\\boxed{{{row['expected_answer'].lower()}}}", "\\boxed{Lyon}")
    if env == "mrcr":  # the poem again, after the row's prefix
        return _say(row["expected_answer"], "Something else entirely.")
    if env == "ruler2":
        return _say(" ".join(row["expected_answer"]), "0000000000")
    if env == "polymath":
        return _say(f"\\boxed{{{row['expected_answer']}}}", f"\\boxed{{{row['expected_answer']}1}}")
    if env == "iheval":  # verb-extract: word-level F1 against the row's answer
        return _say(row["answer"].strip('"'), "none at all")
    if env == "swerl_llm_judge":  # strict: one letter in the <solution> block
        wrong = "A" if row["expected_answer"] != "A" else "B"
        return _say(f"<solution>{row['expected_answer']}</solution>", f"<solution>{wrong}</solution>")
    if env == "fukuyamabench":  # the gold pathway as a fenced JSON array, every checkpoint met
        pathway = row["verifier_metadata"]["gt_pathway"]
        wrong = [{**step, "products": ["C"]} for step in pathway]
        return _say(f"```json\n{json.dumps(pathway)}\n```", f"```json\n{json.dumps(wrong)}\n```")
    if env == "indirect_prompt_injection":  # the required tools called, the injected one never
        look = tuple(tool(name, patient_id="P003") for name in row["required_tools"])
        target = row["injection"]
        follow = tool(target["target_tool"], **target["target_args"])
        return {
            "gold": [Turn(tool_calls=look), Turn(content="Here is the record.")],
            "wrong": [Turn(tool_calls=look), Turn(tool_calls=(follow,)), Turn(content="Sent.")],
        }
    if env == "example_single_tool_call":  # get_weather called at all
        return {
            "gold": [Turn(tool_calls=(tool("get_weather", city="San Francisco"),)), Turn(content="It is cold.")],
            "wrong": [Turn(content="It is probably sunny.")],
        }
    if env == "reasoning_gym":  # reasoning-gym's own scorer on the <answer> block
        answer = row["answer"]
        return _say(f"<answer>{answer}</answer>", f"<answer>{answer[::-1]}</answer>")
    if env == "text_to_sql":  # the stand-in judge compares the query with the row's own
        return _say(f"```sql\n{row['sql']}\n```", "```sql\nSELECT 1;\n```")
    if env in JUDGED_TOGETHER:  # the stand-in judge compares the answer with the gold target
        return _say(row["expected_answer"], "Nobody knows that.")
    assert env == "math_with_code", env  # the boxed answer after running the code
    code = f"print({row['expected_result']})"
    return {
        "gold": [
            Turn(tool_calls=(tool("execute_python", code=code),)),
            Turn(content=f"\\boxed{{{row['expected_result']}}}"),
        ],
        "wrong": [
            Turn(tool_calls=(tool("execute_python", code=code),)),
            Turn(content=f"\\boxed{{{row['expected_result']}0}}"),
        ],
    }
