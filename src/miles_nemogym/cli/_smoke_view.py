"""How a smoke run reads: one line per finished episode, the verdict table, its JSON."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.table import Table

from miles_nemogym.episode.record import SWE_ENVIRONMENT, count_text, passed, verdict
from miles_nemogym.errors import counted
from miles_nemogym.smoke.environments import EnvironmentEpisode, EnvironmentSmokeReport
from miles_nemogym.smoke.run import OFFLINE_REASON, SmokeEpisode, SmokeReport, is_offline_failure

__all__ = [
    "ENVIRONMENT_LEGEND",
    "LEGEND",
    "build_table",
    "environment_json",
    "environment_line",
    "environment_tables",
    "episode_line",
    "report_json",
]

LEGEND = (
    "verdict: resolved, unresolved, or the failure kind of an episode set aside (not trained on), "
    "as `episodes` shows it; turns: agent turns the episode's record counts (- when it has none); "
    "calls: requests the policy answered; F2P: FAIL_TO_PASS tests passed/failed."
)


def reward_text(value: Any) -> str:
    """``0.0``, ``1.0``, ``0.33``: one decimal unless the value needs two."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "-"
    return f"{value:.1f}" if round(value, 1) == round(value, 2) else f"{value:.2f}"


def _patch(value: Any) -> str:
    return {True: "yes", False: "no"}.get(value, "-") if isinstance(value, bool) else "-"


def _set_aside(episode: SmokeEpisode) -> bool:
    record = episode.record
    return record is None or record.status != "ok"


def _verdict(episode: SmokeEpisode) -> str:
    """The episode's verdict word as the episode store's views name it (``record.verdict``)."""
    record = episode.record
    if record is None:
        return "no record"
    return verdict(
        masked=_set_aside(episode),
        failure_kind=record.failure_kind,
        swe=record.env == SWE_ENVIRONMENT,
        passed=passed(record, episode.result.get("reward")),
    )


@dataclass(frozen=True)
class Footnotes:
    """The numbered reasons under the table, and which episode points at which."""

    numbers: tuple[int | None, ...]
    texts: tuple[str, ...]


def _footnotes(episodes: Sequence[SmokeEpisode]) -> Footnotes:
    """One note per distinct reason (offline failures share one), numbered in row order."""
    texts: list[str] = []
    numbers: list[int | None] = []
    for episode in episodes:
        record = episode.record
        if not _set_aside(episode):
            numbers.append(None)
            continue
        kind = (record.failure_kind if record else None) or "no episode record"
        reason = (
            OFFLINE_REASON
            if is_offline_failure(record)
            else ((record.failure_reason if record else None) or "no reason given")
        )
        text = f"{kind}: {reason}"
        if text not in texts:
            texts.append(text)
        numbers.append(texts.index(text) + 1)
    return Footnotes(tuple(numbers), tuple(texts))


def build_table(episodes: Sequence[SmokeEpisode]) -> tuple[Table, Footnotes]:
    """The verdict table (fits 80 columns) and its footnotes."""
    notes = _footnotes(episodes)
    width = max([len("instance"), *(len(e.instance_id) for e in episodes)])
    table = Table(
        title="smoke: one row per episode, as the trainer stores it",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        pad_edge=False,
    )
    table.add_column("instance", no_wrap=True, min_width=width)
    table.add_column("verdict", overflow="fold")  # at 80 columns a note number wraps under its kind
    for name in ("turns", "calls", "patch", "F2P", "reward"):
        table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    for episode, number in zip(episodes, notes.numbers, strict=True):
        record = episode.record
        f2p = record.fail_to_pass if record else None
        aside = _set_aside(episode)
        table.add_row(
            episode.instance_id,
            f"[red]{_verdict(episode)}[/red] [{number}]" if aside else f"[green]{_verdict(episode)}[/green]",
            count_text(record.turns if record else None),
            "-" if episode.policy_requests is None else str(episode.policy_requests),
            _patch(record.patch_applied if record else None),
            f"{f2p.passed}/{f2p.failed}" if f2p else "-",
            reward_text(episode.result.get("reward")),
        )
    return table, notes


def episode_line(episode: SmokeEpisode) -> str:
    """The line printed as one episode finishes (rich markup)."""
    record = episode.record
    took = f", {record.elapsed_s:.0f} s" if record else ""
    if record is None or _set_aside(episode):
        kind = (record.failure_kind if record else None) or "no record"
        if is_offline_failure(record):
            kind = "no network (expected)"
        return f"[red]✗[/red] {episode.instance_id}  set aside: {kind}{took}"
    return (
        f"[green]✓[/green] {episode.instance_id}  {_verdict(episode)}: {count_text(record.turns)} turns, "
        f"reward {reward_text(episode.result.get('reward'))}{took}"
    )


def report_json(report: SmokeReport) -> dict[str, Any]:
    """The run as one JSON document (``--json FILE``), for scripts."""
    notes = _footnotes(report.episodes)
    return {
        "chain_worked": report.chain_worked,
        "prompt_data": str(report.data_path) if report.data_path else None,
        "results_dir": str(report.results_dir) if report.results_dir else None,
        "server_log": str(report.server_log) if report.server_log else None,
        "episode_store": str(report.episode_dir) if report.episode_dir else None,
        "episode_store_step": report.step,
        "episodes": [
            {
                "instance_id": episode.instance_id,
                "repo": episode.repo,
                "verdict": _verdict(episode),
                "set_aside": _set_aside(episode),
                "expected_offline": is_offline_failure(episode.record),
                "note": notes.texts[number - 1] if number else None,
                "reward": episode.result.get("reward"),
                "policy_calls": episode.policy_requests,
                "nemogym": episode.record.model_dump(mode="json") if episode.record else {},
            }
            for episode, number in zip(report.episodes, notes.numbers, strict=True)
        ],
    }


# -- smoke --env: environment rows ------------------------------------------------------

ENVIRONMENT_LEGEND = (
    "answer: the row's gold answer, a wrong one, a plain reply (its rows carry no gold smoke can "
    "read) or your model's; verdict: passed, failed, or the failure kind of an episode set aside; "
    "turns: model calls the record counts; calls: requests the policy answered."
)


def _environment_verdict(episode: EnvironmentEpisode) -> str:
    record = episode.record
    if record is None:
        return "no record"
    return verdict(masked=record.mask_sample, failure_kind=record.failure_kind, swe=False, passed=episode.passed)


def environment_line(episode: EnvironmentEpisode) -> str:
    """The line printed as one environment episode finishes (rich markup)."""
    record = episode.record
    took = f", {record.elapsed_s:.1f} s" if record else ""
    mark = "[red]✗[/red]" if episode.surprise else "[green]✓[/green]"
    return (
        f"{mark} {episode.task_id}  {episode.answer} {_environment_verdict(episode)}, "
        f"reward {reward_text(episode.reward)}{took}"
    )


def environment_tables(report: EnvironmentSmokeReport) -> tuple[list[Table], list[str]]:
    """One table per environment (fits 80 columns) and the numbered notes under them: why an
    episode says the chain is broken (a gold answer that failed, a wrong one that passed, ...)."""
    notes: list[str] = []
    tables = []
    for environment in report.plans:
        episodes = [e for e in report.episodes if e.environment == environment.name]
        prefix = f"{environment.name}/"
        width = max([len("task"), *(len(e.task_id.removeprefix(prefix)) for e in episodes)])
        table = Table(
            title=f"{environment.name}: {counted(len(episodes), 'episode')}",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 1, 0, 0),
            pad_edge=False,
        )
        table.add_column("task", no_wrap=True, min_width=min(width, 36), max_width=36, overflow="ellipsis")
        table.add_column("answer", no_wrap=True)
        table.add_column("verdict", overflow="fold")
        for name in ("turns", "calls", "reward"):
            table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
        for episode in episodes:
            record = episode.record
            shown = _environment_verdict(episode)
            if episode.surprise:
                text = f"{episode.task_id}: {episode.surprise}"
                notes.append(text)
                shown = f"[red]{shown}[/red] [{len(notes)}]"
            else:
                shown = f"[green]{shown}[/green]" if episode.passed else shown
            table.add_row(
                episode.task_id.removeprefix(prefix),
                episode.answer,
                shown,
                count_text(record.turns if record else None),
                "-" if episode.policy_calls is None else str(episode.policy_calls),
                reward_text(episode.reward),
            )
        tables.append(table)
    return tables, notes


def environment_json(report: EnvironmentSmokeReport) -> dict[str, Any]:
    """The environment run as one JSON document (``--json FILE``)."""
    return {
        "chain_worked": report.chain_worked,
        "environments": [p.name for p in report.plans],
        "episode_store": str(report.episode_dir) if report.episode_dir else None,
        "episode_store_step": report.step,
        "episodes": [
            {
                "environment": episode.environment,
                "task_id": episode.task_id,
                "answer": episode.answer,
                "verdict": _environment_verdict(episode),
                "reward": episode.reward,
                "problem": episode.surprise,
                "policy_calls": episode.policy_calls,
                "nemogym": episode.record.model_dump(mode="json") if episode.record else {},
            }
            for episode in report.episodes
        ],
    }
