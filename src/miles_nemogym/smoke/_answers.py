"""A gold and a wrong answer for an environment row, from the gold its row carries."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from miles_nemogym.smoke._policy import FINAL_ANSWER, Answer

__all__ = ["ANSWERED", "GOLD", "WRONG", "Answers", "answers"]

Answers = dict[str, tuple[Answer, ...]]  # {"gold": turns, "wrong": turns}; empty when the row carries no gold
GOLD, WRONG, PLAIN = "gold", "wrong", "plain"  # PLAIN: one plain reply, when no gold is known

PLAIN_ANSWER = (Answer(content="This is the miles-nemogym scripted smoke policy: it does not know the answer."),)


def _said(gold: str, wrong: str) -> Answers:
    return {GOLD: (Answer(content=gold),), WRONG: (Answer(content=wrong),)}


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
    return _said(f"The answer is \\boxed{{{gold}}}", f"The answer is \\boxed{{{wrong}}}")


def _exact(row: Mapping[str, Any]) -> Answers:
    """equivalence_rule: its shipped config grades the message text exactly."""
    gold = row.get("expected_answer")
    if not isinstance(gold, str) or not gold:
        return {}
    wrong = gold[::-1] if gold[::-1] != gold else gold + " (not quite)"
    return _said(gold, wrong)


def _expected_calls(row: Mapping[str, Any]) -> Answers:
    """xlam_fc: the calls in ``expected_answers``, made at once; wrong: none of them."""
    calls = [
        (str(call["name"]), dict(call.get("arguments") or {}))
        for call in row.get("expected_answers") or []
        if isinstance(call, Mapping) and isinstance(call.get("name"), str)
    ]
    if not calls:
        return {}
    gold = (Answer(tool_calls=tuple(calls)), FINAL_ANSWER)  # every call in one turn
    return {GOLD: gold, WRONG: (Answer(content="I will not call any tool."),)}


def _ground_truth(row: Mapping[str, Any]) -> Answers:
    """workplace_assistant: the state after ``ground_truth``'s calls is graded; wrong: no call (none if none is due)."""
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
    gold = (*(Answer(tool_calls=(call,)) for call in calls), FINAL_ANSWER)  # a call per turn
    return {GOLD: gold, WRONG: (Answer(content="I will not change anything."),)}


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
            FINAL_ANSWER,
        )

    return {GOLD: submit(values), WRONG: submit(wrong)}


def _grid(row: Mapping[str, Any]) -> Answers:
    """arc_agi: the boxed ``expected_output`` grid; wrong: the grid with its first cell changed."""
    grid = row.get("expected_output")
    if not isinstance(grid, list) or not grid or not all(isinstance(line, list) and line for line in grid):
        return {}
    wrong = [list(line) for line in grid]
    wrong[0][0] = (int(wrong[0][0]) + 1) % 10
    shown, wrong_shown = json.dumps(grid), json.dumps(wrong)
    return _said(f"The output grid is \\boxed{{{shown}}}", f"The output grid is \\boxed{{{wrong_shown}}}")


def _minutes(said: str) -> int:
    """``10am``, ``1:45pm`` or ``16:00`` as minutes after midnight (the calendar server's forms)."""
    found = re.fullmatch(r"(\d{1,2})(?::(\d{2}))?\s*(am|pm)?", said.strip())
    if found is None:
        raise ValueError(said)
    hour, minute, half = int(found[1]), int(found[2] or 0), found[3]
    if half:
        hour = hour % 12 + (12 if half == "pm" else 0)
    return hour * 60 + minute


def _window(event: Mapping[str, Any]) -> tuple[int, int]:
    """The earliest start and the latest end ``event``'s ``exp_cal_state`` entry allows."""
    low, high = _minutes(event["min_time"]), _minutes(event["max_time"])
    constraint = event.get("constraint") or ""
    duration = int(event["duration"])
    if constraint.startswith("before "):
        high = min(high, _minutes(constraint[7:]))
    elif constraint.startswith("after "):
        low = max(low, _minutes(constraint[6:]))
    elif constraint.startswith("between "):
        start, end = constraint[8:].split(" and ")
        low, high = max(low, _minutes(start)), min(high, _minutes(end))
    elif constraint.startswith("at "):
        low = max(low, _minutes(constraint[3:]))
        high = min(high, low + duration)
    elif constraint:
        raise ValueError(constraint)
    return low, high


def _schedule(events: list[Mapping[str, Any]], taken: list[tuple[int, int]]) -> list[int] | None:
    """Start times (15-minute steps) fitting each event in its window without overlaps, or None."""
    if not events:
        return []
    event, rest = events[0], events[1:]
    duration = int(event["duration"])
    low, high = _window(event)
    for start in range(low, high - duration + 1, 15):
        if all(start + duration <= a or start >= b for a, b in taken):
            found = _schedule(rest, [*taken, (start, start + duration)])
            if found is not None:
                return [start, *found]
    return None


def _calendar(row: Mapping[str, Any]) -> Answers:
    """calendar: a JSON schedule meeting ``exp_cal_state``'s constraints; wrong: one event 15 minutes longer."""
    state = row.get("exp_cal_state")
    state = json.loads(state) if isinstance(state, str) else state
    if not isinstance(state, Mapping) or not state:
        return {}
    events = sorted(state.values(), key=lambda e: _window(e)[1] - _window(e)[0] - int(e["duration"]))
    starts = _schedule(events, [])
    if starts is None:
        return {}

    def listed(longer: int) -> str:
        return json.dumps(
            [
                {
                    "event_id": e["event_id"],
                    "event_name": f"event {e['event_id']}",
                    "start_time": f"{start // 60:02d}:{start % 60:02d}",
                    "duration": int(e["duration"]) + (longer if index == 0 else 0),
                }
                for index, (e, start) in enumerate(zip(events, starts, strict=True))
            ]
        )

    return _said(listed(0), listed(15))


_RULES: dict[str, Callable[[Mapping[str, Any]], Answers]] = {
    "mcqa": _boxed,
    "math_with_judge": _boxed,
    "equivalence_rule": _exact,
    "xlam_fc": _expected_calls,
    "workplace_assistant": _ground_truth,
    "example_multi_step": _synonyms,
    "arc_agi": _grid,
    "calendar": _calendar,
}
ANSWERED = tuple(_RULES)  # the resources servers whose rows have a gold and a wrong answer here


def answers(server: str, row: Mapping[str, Any]) -> Answers:
    """The gold and wrong answers (in that order) of ``row`` of resources server ``server``; ``{}`` when unknown."""
    rule = _RULES.get(server)
    if rule is None:
        return {}
    try:
        return rule(row)
    except (KeyError, TypeError, ValueError):  # a row of another shape than the shipped ones
        return {}
