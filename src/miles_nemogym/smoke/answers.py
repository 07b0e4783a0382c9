"""A gold and a wrong answer for an environment row, from the gold its row carries.

``smoke --env`` plays them through the scripted policy, so a user sees the environment score
its best and its worst before paying for a model. Keyed by resources server (the folder in
the wheel); each rule reads only fields nemo-gym 0.7.0's rows of that server carry and
writes the answer its verifier grades (docs/environments.md, "Smoke"). A server without a
rule, or a row without its gold, gets none: smoke then plays one plain reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from miles_nemogym.smoke.policy import Answer

Answers = dict[str, tuple[Answer, ...]]
"""``{"gold": turns, "wrong": turns}``; empty when the row carries no gold."""

GOLD, WRONG, PLAIN = "gold", "wrong", "plain"
"""The answers smoke plays: the row's gold, a wrong one, or (no gold known) one plain reply."""

PLAIN_ANSWER = (Answer(content="This is the miles-nemogym scripted smoke policy: it does not know the answer."),)


def _boxed(row: Mapping[str, Any]) -> Answers:
    """mcqa (its ``grading_mode`` reads the boxed letter) and math_with_judge (math-verify)."""
    gold = str(row.get("expected_answer", "")).strip()
    if not gold:
        return {}
    letters = [str(key) for option in row.get("options") or [] if isinstance(option, Mapping) for key in option]
    if letters:  # a multiple-choice row: another of its letters
        others = [letter for letter in letters if letter != gold]
        if not others:
            return {}
        wrong = others[0]
    else:
        wrong = str(int(gold) + 1) if gold.lstrip("-").isdigit() else "0" if gold != "0" else "1"
    return {
        GOLD: (Answer(content=f"The answer is \\boxed{{{gold}}}"),),
        WRONG: (Answer(content=f"The answer is \\boxed{{{wrong}}}"),),
    }


def _exact(row: Mapping[str, Any]) -> Answers:
    """equivalence_rule: its shipped config grades the message text exactly."""
    gold = row.get("expected_answer")
    if not isinstance(gold, str) or not gold:
        return {}
    wrong = gold[::-1] if gold[::-1] != gold else gold + " (not quite)"
    return {GOLD: (Answer(content=gold),), WRONG: (Answer(content=wrong),)}


def _calls(calls: Sequence[tuple[str, Mapping[str, Any]]], one_turn: bool) -> tuple[Answer, ...]:
    if one_turn:
        return (Answer(tool_calls=tuple(calls)), Answer(content="Done."))
    return (*(Answer(tool_calls=(call,)) for call in calls), Answer(content="Done."))


def _expected_calls(row: Mapping[str, Any]) -> Answers:
    """xlam_fc: the calls in ``expected_answers``, made at once; wrong: none of them."""
    calls = [
        (str(call["name"]), dict(call.get("arguments") or {}))
        for call in row.get("expected_answers") or []
        if isinstance(call, Mapping) and isinstance(call.get("name"), str)
    ]
    if not calls:
        return {}
    return {GOLD: _calls(calls, one_turn=True), WRONG: (Answer(content="I will not call any tool."),)}


def _ground_truth(row: Mapping[str, Any]) -> Answers:
    """workplace_assistant: the state after ``ground_truth``'s calls is graded; wrong: no call,
    which leaves the state as it was (no answer when the truth is to change nothing)."""
    calls = []
    for call in row.get("ground_truth") or []:
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            return {}
        arguments = call.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return {}
        if not isinstance(arguments, Mapping):
            return {}
        calls.append((str(call["name"]), dict(arguments)))
    if not calls:
        return {}
    return {GOLD: _calls(calls, one_turn=False), WRONG: (Answer(content="I will not change anything."),)}


def _synonyms(row: Mapping[str, Any]) -> Answers:
    """example_multi_step: look each synonym up, then submit the values in order; wrong: reversed."""
    synonyms, values = row.get("expected_synonyms"), row.get("expected_synonym_values")
    if not isinstance(synonyms, list) or not isinstance(values, list) or not values:
        return {}
    lookups = tuple(("get_synonym_value", {"synonym": synonym}) for synonym in synonyms)
    wrong = values[::-1] if values[::-1] != values else [*values, 0]

    def submit(given: list[Any]) -> tuple[Answer, ...]:
        return (
            Answer(tool_calls=lookups),
            Answer(tool_calls=(("extract_synonym_values", {"synonym_values": given}),)),
            Answer(content="Done."),
        )

    return {GOLD: submit(values), WRONG: submit(wrong)}


_RULES: dict[str, Callable[[Mapping[str, Any]], Answers]] = {
    "mcqa": _boxed,
    "math_with_judge": _boxed,
    "equivalence_rule": _exact,
    "xlam_fc": _expected_calls,
    "workplace_assistant": _ground_truth,
    "example_multi_step": _synonyms,
}


def answers(server: str, row: Mapping[str, Any]) -> Answers:
    """The gold and wrong answers of ``row`` of resources server ``server``; ``{}`` when unknown."""
    rule = _RULES.get(server)
    if rule is None:
        return {}
    try:
        return rule(row)
    except (KeyError, TypeError, ValueError):  # a row of another shape than the shipped ones
        return {}


def has_rule(server: str) -> bool:
    """Whether smoke knows where ``server``'s rows keep their gold."""
    return server in _RULES
