"""Show an episode store as text: a table per step, a list of episodes, one episode turn by
turn (reading is ``store/reader.py``, the HTML page ``store/page.py``). Pure functions over
loaded episodes; the CLI (``cli/episodes.py``) prints.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from miles_nemogym.store.reader import StoredEpisode

OUTPUT_MAX_CHARS = 600
"""A command's output is trimmed to this in ``--show`` (head and tail kept)."""


def select(
    episodes: list[StoredEpisode], *, instance: str | None = None, kind: str | None = None, step: int | None = None
) -> list[StoredEpisode]:
    """The episodes matching every given filter."""
    return [
        e
        for e in episodes
        if (instance is None or e.instance_id == instance)
        and (kind is None or e.kind == kind)
        and (step is None or e.step == step)
    ]


@dataclass
class StepRow:
    """One line of the per-step table."""

    role: str
    step: int | None
    episodes: int
    valid: int
    resolved: int
    failures: Counter[str]
    turns_mean: float | None
    time_mean_s: float | None

    @property
    def resolve_rate(self) -> float | None:
        return self.resolved / self.valid if self.valid else None


def step_rows(episodes: list[StoredEpisode]) -> list[StepRow]:
    """Per (role, step): episodes, resolve rate over valid ones, failures by kind, turns, time."""
    groups: dict[tuple[str, int | None], list[StoredEpisode]] = {}
    for episode in episodes:
        groups.setdefault((episode.role, episode.step), []).append(episode)
    rows = []
    for (role, step), members in groups.items():
        valid = [e for e in members if not e.record.get("mask_sample")]
        turns = [float(e.record["turns"]) for e in valid if e.record.get("turns") is not None]
        times = [float(e.record["elapsed_s"]) for e in members if e.record.get("attempts")]
        rows.append(
            StepRow(
                role=role,
                step=step,
                episodes=len(members),
                valid=len(valid),
                resolved=sum(1 for e in valid if e.record.get("resolved")),
                failures=Counter(e.kind for e in members if e.record.get("mask_sample")),
                turns_mean=sum(turns) / len(turns) if turns else None,
                time_mean_s=sum(times) / len(times) if times else None,
            )
        )
    return rows


def fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def step_label(step: int | None) -> str:
    return "pending" if step is None else str(step)


def table_text(rows: list[StepRow]) -> str:
    """The per-step table as aligned text."""
    header = ("role", "step", "episodes", "valid", "resolve rate", "failures by kind", "mean turns", "mean time s")
    lines = [header]
    for row in rows:
        failures = ", ".join(f"{kind} {count}" for kind, count in sorted(row.failures.items())) or "-"
        lines.append(
            (
                row.role,
                step_label(row.step),
                str(row.episodes),
                str(row.valid),
                fmt(row.resolve_rate, "{:.1%}"),
                failures,
                fmt(row.turns_mean, "{:.1f}"),
                fmt(row.time_mean_s, "{:.1f}"),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def episode_list_text(episodes: list[StoredEpisode]) -> str:
    """One line per episode: id, role, step, instance, verdict, reward, turns."""
    lines = []
    for e in episodes:
        eval_set = f"/{e.entry.get('eval_set')}" if e.entry.get("eval_set") else ""
        lines.append(
            f"{e.episode_id}  {e.role}{eval_set}  step {step_label(e.step)}  {e.instance_id}  {e.kind}  "
            f"reward {e.entry.get('reward')}  turns {e.record.get('turns')}"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- one episode


def trim(text: str, limit: int = OUTPUT_MAX_CHARS) -> str:
    """``text`` cut in the middle to at most ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n… [{len(text) - limit} characters cut] …\n{text[-half:]}"


@dataclass
class Turn:
    thought: str = ""
    commands: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


def _message_text(item: dict[str, Any]) -> str:
    parts = []
    for content in item.get("content") or []:
        if isinstance(content, dict) and isinstance(content.get("text"), str):
            parts.append(content["text"])
    for summary in item.get("summary") or []:
        if isinstance(summary, dict) and isinstance(summary.get("text"), str):
            parts.append(summary["text"])
    return "\n".join(parts)


def _command(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        arguments = parsed
    command = arguments.get("command") if isinstance(arguments, dict) else None
    if isinstance(command, str):
        return command
    return json.dumps(arguments)


def turns_of(answer: Any) -> list[Turn]:
    """The episode's turns from the ``/run`` answer's Responses ``output``: a turn is the
    model's items up to the harness's ``function_call_output`` answers."""
    response = answer.get("response") if isinstance(answer, dict) else None
    output = response.get("output") if isinstance(response, dict) else None
    turns: list[Turn] = []
    current: Turn | None = None
    for item in output or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call_output":
            if current is None:
                current = Turn()
                turns.append(current)
            current.outputs.append(str(item.get("output") or ""))
            continue
        if current is None or current.outputs:
            current = Turn()
            turns.append(current)
        if kind == "function_call":
            current.commands.append(_command(item.get("arguments")))
        else:
            text = _message_text(item)
            current.thought = f"{current.thought}\n{text}".strip() if current.thought else text
    return turns


def patch_of(answer: Any) -> str | None:
    metadata = answer.get("metadata") if isinstance(answer, dict) else None
    patch = metadata.get("model_patch") if isinstance(metadata, dict) else None
    return patch if isinstance(patch, str) else None


def report_of(answer: Any, instance_id: str) -> dict[str, Any] | None:
    metadata = answer.get("metadata") if isinstance(answer, dict) else None
    reports = metadata.get("eval_report") if isinstance(metadata, dict) else None
    if not isinstance(reports, dict):
        return None
    report = reports.get(instance_id) or (next(iter(reports.values())) if len(reports) == 1 else None)
    return report if isinstance(report, dict) else None


def report_lines(report: dict[str, Any] | None) -> list[str]:
    if report is None:
        return ["(no test report)"]
    lines = [
        f"resolved: {report.get('resolved')}   patch applied: {report.get('patch_successfully_applied')}",
    ]
    tests = report.get("tests_status") or {}
    for category in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        status = tests.get(category) or {}
        passed, failed = status.get("success") or [], status.get("failure") or []
        lines.append(f"{category}: {len(passed)} passed, {len(failed)} failed")
        lines.extend(f"  FAILED {name}" for name in failed[:20])
    return lines


def show_text(episode: StoredEpisode) -> str:
    """One episode, readably: header, each turn (thought, command, output trimmed), the
    submitted patch, the test report; a failed one also its failure and what came back."""
    record, answer = episode.record, episode.entry.get("answer")
    out = [
        f"episode {episode.episode_id}   instance {episode.instance_id}   {episode.role}"
        + (f"/{episode.entry.get('eval_set')}" if episode.entry.get("eval_set") else "")
        + f"   step {step_label(episode.step)}   session {episode.entry.get('session_id')}",
        f"verdict: {episode.kind}   reward {episode.entry.get('reward')}   turns {record.get('turns')}   "
        f"time {record.get('elapsed_s')} s   attempts {record.get('attempts')}",
    ]
    if record.get("mask_sample"):
        out.append(f"failure: {record.get('failure_kind')}: {record.get('failure_reason')}")
    if isinstance(answer, dict) and set(answer) == {"text"}:
        out += ["", "answer (not a /run result):", trim(str(answer["text"]))]
    for number, turn in enumerate(turns_of(answer), 1):
        out += ["", f"--- turn {number}"]
        if turn.thought:
            out += ["thought:", trim(turn.thought, 2000)]
        for command in turn.commands:
            out += ["command:", "  $ " + command]
        for output in turn.outputs:
            out += ["output:", trim(output)]
    patch = patch_of(answer)
    out += ["", "--- patch", patch if patch else "(no patch)"]
    out += ["", "--- test report", *report_lines(report_of(answer, episode.instance_id))]
    return "\n".join(out)
