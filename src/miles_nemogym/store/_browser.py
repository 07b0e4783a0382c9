"""An episode store as text: a table per step, a list of episodes, one episode turn by turn. Pure."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from miles_nemogym import fit
from miles_nemogym.episode.record import SWE_ENVIRONMENT, finite
from miles_nemogym.store._reader import StoredEpisode, count_text, reward_text

__all__ = [
    "PASS_RATE",
    "SWE_RESOLVE_RATE",
    "LongText",
    "Row",
    "cut_head",
    "episode_list_text",
    "episode_parts",
    "failure_lines",
    "filed_label",
    "head_groups",
    "known_elsewhere",
    "mean",
    "printable",
    "quality_label",
    "rate_name",
    "row_cells",
    "select",
    "server_error",
    "several_environments",
    "step_label",
    "summary_rows",
    "table_text",
    "trajectory_counts",
    "trim",
    "verdict_label",
]

_OUTPUT_MAX_CHARS = 600  # a command's output is trimmed to this in --show (head and tail kept)


def select(
    episodes: list[StoredEpisode],
    *,
    instance: str | None = None,
    kind: str | None = None,
    step: int | None = None,
    environments: Collection[str] | None = None,
) -> list[StoredEpisode]:
    """The episodes matching every given filter (``environments``: any of them)."""
    return [
        e
        for e in episodes
        if (instance is None or e.instance_id == instance)
        and (kind is None or e.kind == kind)
        and (step is None or e.step == step)
        and (not environments or e.environment in environments)
    ]


# Everything below reads store values as untrusted: any field may be missing, of another
# type, or hold terminal control sequences; a view shows what it can and never raises.

_TERMINAL_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI: cursor moves, colours, screen clear
    # OSC (title, clipboard), DCS, SOS, PM, APC: the string up to its terminator
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x00-\x1f\x7f-\x9f]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"  # any other escape (character sets, full reset)
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # any other C0 or C1 control: newline and tab stay
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` without terminal control sequences or characters (newline, tab kept; CRLF as newline)."""
    if not _CONTROL.search(text):
        return text
    return _TERMINAL_SEQUENCE.sub("", text.replace("\r\n", "\n"))


def mean(values: Iterable[float | None]) -> float | None:
    """The mean of the numbers among ``values`` (None: missing), or None when there are none."""
    numbers = [v for v in values if v is not None]
    found = sum(numbers) / len(numbers) if numbers else None
    return found if found is None or math.isfinite(found) else None  # finite numbers past a float's range


@dataclass
class Row:
    """One line of the per-step table (``environment`` None) or of the per-environment one (``step`` None)."""

    role: str
    step: int | None
    episodes: int
    valid: int
    passed: int  # valid episodes that resolved (SWE) or passed (another environment)
    failures: Counter[str]
    turns_mean: float | None
    time_mean_s: float | None
    reward_mean: float | None
    environment: str | None = None

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.valid if self.valid else None


def _row(role: str, step: int | None, members: list[StoredEpisode], environment: str | None = None) -> Row:
    valid = [e for e in members if not e.masked]
    return Row(
        role=role,
        step=step,
        episodes=len(members),
        valid=len(valid),
        passed=sum(1 for e in valid if e.passed),
        failures=Counter(e.kind for e in members if e.masked),
        turns_mean=mean([finite(e.record.get("turns")) for e in valid]),
        time_mean_s=mean([finite(e.record.get("elapsed_s")) for e in members if e.record.get("attempts")]),
        reward_mean=mean([finite(e.entry.get("reward")) for e in valid]),
        environment=environment,
    )


def summary_rows(episodes: list[StoredEpisode], per_environment: bool = False) -> list[Row]:
    """Per (role, step), or per (role, environment) by name over every step shown: episodes, pass rate
    over valid ones, failures by kind, turns, time."""
    groups: dict[tuple[str, Any], list[StoredEpisode]] = {}
    for episode in sorted(episodes, key=lambda e: (e.role, e.environment)) if per_environment else episodes:
        groups.setdefault((episode.role, episode.environment if per_environment else episode.step), []).append(episode)
    return [
        _row(role, None, members, key) if per_environment else _row(role, key, members)
        for (role, key), members in groups.items()
    ]


def quality_label(episodes: list[StoredEpisode]) -> str:
    """What the pass rate counts: ``resolved`` when every episode is SWE's, else ``passed``."""
    return "resolved" if all(e.environment == SWE_ENVIRONMENT for e in episodes) else "passed"


PASS_RATE = "pass rate"  # passed (SWE: resolved) over valid episodes, of every environment
RESOLVE_RATE = "resolve rate"  # the pass rate of a store whose episodes are all SWE-bench's
SWE_RESOLVE_RATE = "SWE resolve rate"  # over valid SWE-bench episodes alone, beside other environments


def rate_name(quality: str) -> str:
    """The one name of the rate over every valid episode for ``quality`` (``quality_label``), in every view."""
    return RESOLVE_RATE if quality == "resolved" else PASS_RATE


def several_environments(episodes: list[StoredEpisode]) -> bool:
    return len({e.environment for e in episodes}) > 1


def fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def step_label(step: int | None) -> str:
    return "pending" if step is None else str(step)


def row_cells(row: Row) -> tuple[str, ...]:
    """Printable cells: role, step (or environment), episodes, valid, rate, turns, time (or reward), failures."""
    per_environment = row.environment is not None
    return (
        row.role,
        printable(str(row.environment)) if per_environment else step_label(row.step),
        str(row.episodes),
        str(row.valid),
        fmt(row.pass_rate, "{:.1%}"),
        fmt(row.turns_mean, "{:.1f}"),
        fmt(row.reward_mean, "{:.2f}") if per_environment else fmt(row.time_mean_s, "{:.1f}"),
        printable(", ".join(f"{kind} {count}" for kind, count in sorted(row.failures.items())) or "-"),
    )


def table_text(rows: list[Row], width: int = fit.MIN_WIDTH, quality: str = "resolved") -> str:
    """The per-step (or per-environment) table within ``width``: failures wrap, then columns go."""
    per_environment = bool(rows) and rows[0].environment is not None
    lines: list[tuple[str, ...]] = [
        ("role", "environment", "episodes", "valid", PASS_RATE, "reward", "mean turns", "failures by kind")
        if per_environment
        else ("role", "step", "episodes", "valid", rate_name(quality), "mean turns", "mean s", "failures by kind")
    ]
    for row in rows:
        *head, turns, last, failures = row_cells(row)
        lines.append((*head, last, turns, failures) if per_environment else (*head, turns, last, failures))
    return fit.table(lines, width, drop_order=(6, 3, 5) if per_environment else (5, 6, 3))


def _eval_set(episode: StoredEpisode) -> str:
    eval_set = episode.entry.get("eval_set")
    return f"/{eval_set}" if eval_set else ""


def _short_ids(ids: list[str], size: int = 12) -> dict[str, str]:
    """Each id cut to its shortest prefix, of at least ``size`` characters, that tells the ids apart."""
    while len({i[:size] for i in ids}) < len(set(ids)):
        size += 1
    return {i: i[:size] for i in ids}


def filed_label(episode: StoredEpisode) -> str:
    """``step N``, or under fully async for a dropped episode ``step N not trained (reason)``."""
    label = f"step {step_label(episode.step)}"
    return label if episode.not_trained is None else f"{label} not trained ({episode.not_trained})"


def verdict_label(episode: StoredEpisode) -> str:
    """The verdict, and under fully async why a dropped episode was not trained."""
    return episode.kind if episode.not_trained is None else f"{episode.kind}, not trained ({episode.not_trained})"


def episode_list_text(episodes: list[StoredEpisode], width: int = fit.MIN_WIDTH) -> str:
    """One line per episode within ``width``: id prefix, instance, role, step, reward, turns, verdict."""
    short = _short_ids([e.episode_id for e in episodes])
    lines = [("episode", "instance", "role", "step", "reward", "turns", "verdict")] + [
        (
            printable(short[e.episode_id]),
            printable(e.instance_id),
            printable(f"{e.role}{_eval_set(e)}"),
            step_label(e.step),
            reward_text(e.entry.get("reward")),
            printable(count_text(e.record.get("turns"))),  # a string of the wrong type is shown as it is
            printable(verdict_label(e)),
        )
        for e in episodes
    ]
    return fit.table(lines, width, drop_order=(3, 2, 5, 4))


def cut_head(text: str, size: int) -> str:
    """At most ``size`` characters from the start, ending at a line (else word) end in the last quarter."""
    head = text[:size]
    if len(text) <= size:
        return head
    for separator in ("\n", " "):
        end = head.rfind(separator)
        if end >= size * 3 // 4:
            return head[: end + 1]
    return head


def trim(text: str, limit: int = _OUTPUT_MAX_CHARS) -> str:
    """``text`` cut in the middle to at most ``limit`` characters (at word ends when it can), saying how much."""
    if len(text) <= limit:
        return text
    head, tail = cut_head(text, limit // 2), text[len(text) - limit // 2 :]
    for separator in ("\n", " "):  # the tail starts at a line (else word) start in its first quarter
        start = tail.find(separator)
        if 0 <= start <= limit // 8:
            tail = tail[start + 1 :]
            break
    return f"{head}\n… [{len(text) - len(head) - len(tail)} characters cut] …\n{tail}"


@dataclass
class Turn:
    thought: str = ""
    commands: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


def _text_of(value: Any) -> str:
    """The text of a Responses content value (a string, or parts with ``text``/``output``); else its JSON."""
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, list):
        return _json(value)
    texts = []
    for part in value:
        if isinstance(part, dict):
            part = next((part[key] for key in ("text", "output") if isinstance(part.get(key), str)), part)
        if part is not None:
            texts.append(part if isinstance(part, str) else _json(part))
    return "\n".join(texts)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


def _command(name: Any, arguments: Any) -> str:
    """A bash call as its command line; another tool's call as its name and JSON arguments."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
        arguments = parsed
    command = arguments.get("command") if isinstance(arguments, dict) else None
    if isinstance(command, str):
        return command
    shown = _json(arguments)
    return f"{name} {shown}" if isinstance(name, str) and name and name != "bash" else shown


def _turns_of(answer: Any) -> list[Turn]:
    """The turns in the ``/run`` answer's ``output``: the model's items up to the tools' outputs."""
    output = _dict(answer, "response").get("output")
    turns: list[Turn] = []
    current: Turn | None = None
    for item in output if isinstance(output, list) else []:
        kind = item.get("type") if isinstance(item, dict) else None
        if current is None or (current.outputs and kind != "function_call_output"):
            current = Turn()
            turns.append(current)
        if kind == "function_call_output":
            current.outputs.append(_text_of(item.get("output")))
        elif kind == "function_call":
            current.commands.append(_command(item.get("name"), item.get("arguments")))
        else:
            texts = (_text_of(item.get("content")), _text_of(item.get("summary"))) if isinstance(item, dict) else ()
            text = "\n".join(t for t in texts if t) if isinstance(item, dict) else _json(item)
            current.thought = f"{current.thought}\n{text}".strip() if current.thought else text
    return turns


def _dict(value: Any, key: str) -> dict[str, Any]:
    """``value[key]`` when both are dicts (store values are untrusted), else an empty dict."""
    found = value.get(key) if isinstance(value, dict) else None
    return found if isinstance(found, dict) else {}


def _names(value: Any) -> list[str]:
    return [str(name) for name in value] if isinstance(value, list) else []


def _report_lines(answer: Any, instance_id: str) -> list[str]:
    reports = _dict(_dict(answer, "metadata"), "eval_report")
    report = reports.get(instance_id) or (next(iter(reports.values())) if len(reports) == 1 else None)
    if not isinstance(report, dict):
        return ["(no test report)"]
    lines = [f"resolved: {report.get('resolved')}   patch applied: {report.get('patch_successfully_applied')}"]
    for category in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        status = _dict(report.get("tests_status"), category)
        passed, failed = _names(status.get("success")), _names(status.get("failure"))
        lines.append(f"{category}: {len(passed)} passed, {len(failed)} failed")
        lines.extend(f"  FAILED {name}" for name in failed[:20])
    return lines


@dataclass(frozen=True)
class LongText:
    """A part of any size: ``--show`` trims it to ``show_limit`` (None: whole), the page collapses it."""

    text: str
    show_limit: int | None = None


def _missing_answer(episode: StoredEpisode) -> str | None:
    """Why the episode has no ``/run`` result to show, or None when it has one."""
    answer = episode.entry.get("answer")
    if isinstance(answer, dict):
        return "no /run result came back" if set(answer) == {"text"} else None
    if answer is None:
        dropped = episode.entry.get("answer_dropped")
        if dropped:
            return f"the answer was not kept: {dropped}"
        return "nothing came back" if episode.masked else "no answer was stored"
    return "the stored answer is not a /run result"


def known_elsewhere(entry: dict[str, Any]) -> list[str | LongText]:
    """What smoke stored beside the answer: the calls its policy answered, the server's trajectory file."""
    parts: list[str | LongText] = []
    calls = entry.get("policy_calls")
    if isinstance(calls, int) and not isinstance(calls, bool):
        parts.append(f"requests the policy answered (counted by the run, not the server): {calls}")
    trajectory = entry.get("server_trajectory")
    if isinstance(trajectory, str) and trajectory:
        parts.append(LongText(f"the server's trajectory file: {trajectory}"))
    return parts


def head_groups(episode: StoredEpisode) -> list[list[str]]:
    """Who the episode is, where it is filed, its verdict: the views' first lines."""
    record, entry = episode.record, episode.entry
    where = [f"{episode.role}{_eval_set(episode)}", filed_label(episode), f"session {entry.get('session_id')}"]
    if episode.environment != SWE_ENVIRONMENT:
        where.insert(0, f"environment {episode.environment}")
    return [
        [f"episode {episode.episode_id}", f"instance {episode.instance_id}"],
        where,
        [f"verdict: {episode.kind}", f"reward {reward_text(entry.get('reward'))}",
         f"time {count_text(record.get('elapsed_s'))} s", f"attempts {count_text(record.get('attempts'))}"],
    ]  # fmt: skip


def trajectory_counts(episode: StoredEpisode) -> str:
    record = episode.record
    turns, calls = count_text(record.get("turns")), count_text(record.get("tool_calls"))
    return f"in the trajectory the server returned: {turns} turns, {calls} tool calls"


def failure_lines(episode: StoredEpisode) -> tuple[str, str]:
    """A set-aside episode's first lines: its HTTP status, its failure kind and reason."""
    record = episode.record
    return (
        f"set aside, not trained on   HTTP status {count_text(record.get('http_status'))}",
        f"failure: {record.get('failure_kind')}: {record.get('failure_reason')}",
    )


def server_error(episode: StoredEpisode) -> str | None:
    """The server's error in the answer (stripped), unless the failure reason already holds it."""
    error = _dict(episode.entry.get("answer"), "metadata").get("error")
    if isinstance(error, str) and error.strip() and error.strip() not in str(episode.record.get("failure_reason")):
        return error.strip()
    return None


def episode_parts(episode: StoredEpisode) -> list[str | LongText]:
    """One episode top to bottom: header, failure, turns, patch, test report (a view makes it ``printable``)."""
    answer, swe = episode.entry.get("answer"), episode.environment == SWE_ENVIRONMENT
    who, where, verdict = head_groups(episode)
    parts: list[str | LongText] = ["   ".join(who + where), "   ".join(verdict), trajectory_counts(episode)]
    if episode.masked:
        set_aside, failure = failure_lines(episode)
        parts += [set_aside, LongText(failure)]
        error = server_error(episode)
        if error is not None:
            parts += ["the server's error, whole:", LongText(error)]
    parts += known_elsewhere(episode.entry)
    missing = _missing_answer(episode)
    if answer is not None and missing:
        text = _text_of(answer["text"]) if isinstance(answer, dict) else _json(answer)
        parts += ["", "answer (not a /run result):", LongText(text, 4 * _OUTPUT_MAX_CHARS)]
    for number, turn in enumerate(_turns_of(answer), 1):
        parts += ["", f"--- turn {number}"]
        if turn.thought:
            parts += ["thought:", LongText(turn.thought, 2000)]
        for command in turn.commands:
            parts += ["command:", LongText("  $ " + command)]
        for output in turn.outputs:
            parts += ["output:", LongText(output, _OUTPUT_MAX_CHARS)]
    if not swe:
        return [*parts, "", "--- verify", *_verify_lines(answer, missing)]
    patch = _dict(answer, "metadata").get("model_patch")
    no_patch = f"(no patch: {missing})" if missing else "(no patch)"
    parts += ["", "--- patch", LongText(patch) if isinstance(patch, str) and patch else no_patch]
    report = [f"(no test report: {missing})"] if missing else _report_lines(answer, episode.instance_id)
    parts += ["", "--- test report", *report]
    return parts


_VERIFY_SHOWN_ELSEWHERE = frozenset({"response", "responses_create_params"})


def _verify_lines(answer: Any, missing: str | None) -> list[str | LongText]:
    """An environment episode's ``/verify`` answer but the transcript (shown as turns) and the request."""
    if missing or not isinstance(answer, dict):
        return [f"(no verify answer: {missing})"]
    fields = [(key, value) for key, value in answer.items() if key not in _VERIFY_SHOWN_ELSEWHERE]
    return [LongText(f"{key}: {_json(value)}", _OUTPUT_MAX_CHARS) for key, value in fields] or ["(empty)"]
