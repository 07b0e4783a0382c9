"""``miles-nemogym smoke --env NAME``: an environment's shipped rows end to end, no GPU, and its report."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from rich.table import Table

from miles_nemogym.data import convert_row
from miles_nemogym.episode.record import EpisodeRecord, passed, read_record
from miles_nemogym.errors import counted
from miles_nemogym.gym.composition import Judge
from miles_nemogym.gym.environments import EnvironmentPlan, EnvironmentServers, plan, refusals
from miles_nemogym.gym.venv import GymEnvironmentError, ensure_gym_venv
from miles_nemogym.settings import Settings
from miles_nemogym.smoke._answers import GOLD, PLAIN, PLAIN_ANSWER, WRONG, answers
from miles_nemogym.smoke._policy import Answer, RecordingPolicy
from miles_nemogym.smoke._swe import file_as_step, report_table, run_rows
from miles_nemogym.store.views import count_text, reward_text, verdict

__all__ = ["EnvironmentEpisode", "EnvironmentSmokeReport", "check_environments", "run_environment_smoke"]

MODEL = "model"  # the answer label of an episode a real model played (--policy-base-url)

_SAMPLING: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 1024, "seed": 1234}


@dataclass
class EnvironmentEpisode:
    """One played row: which answer, what the agent function returned, the policy's calls."""

    environment: str
    task_id: str
    answer: str  # gold, wrong, plain (the rows carry no gold) or model
    result: dict[str, Any]
    policy_calls: int | None = None

    @property
    def record(self) -> EpisodeRecord | None:
        return read_record(self.result).record

    @property
    def reward(self) -> Any:
        return self.result.get("reward")

    @property
    def passed(self) -> bool:
        record = self.record
        return record is not None and passed(record, self.reward)

    @property
    def surprise(self) -> str | None:
        """Why this episode says the chain is broken (gold did not pass, wrong did, set aside, no record), or None."""
        record = self.record
        if record is None:
            return "no episode record came back"
        if record.mask_sample:
            return f"set aside ({record.failure_kind}): {record.failure_reason or 'no reason given'}"
        if self.answer == GOLD and not self.passed:
            return f"the row's gold answer scored {reward_text(self.reward)}, not a pass"
        if self.answer == WRONG and self.passed:
            return f"a wrong answer scored {reward_text(self.reward)}, a pass"
        return None

    @property
    def verdict(self) -> str:
        record = self.record
        if record is None:
            return "no record"
        return verdict(masked=record.mask_sample, failure_kind=record.failure_kind, swe=False, passed=self.passed)

    def line(self) -> str:
        """The line printed as the episode finishes (rich markup)."""
        record = self.record
        took = f", {record.elapsed_s:.1f} s" if record else ""
        mark = "[red]✗[/red]" if self.surprise else "[green]✓[/green]"
        return f"{mark} {self.task_id}  {self.answer} {self.verdict}, reward {reward_text(self.reward)}{took}"


@dataclass
class EnvironmentSmokeReport:
    LEGEND: ClassVar[str] = (
        "answer: the row's gold answer, a wrong one, a plain reply (its rows carry no gold smoke can "
        "read) or your model's; verdict: passed, failed, or the failure kind of an episode set aside; "
        "turns: model calls the record counts; calls: requests the policy answered."
    )
    episodes: list[EnvironmentEpisode] = field(default_factory=list)
    plans: list[EnvironmentPlan] = field(default_factory=list)
    episode_dir: Path | None = None
    step: int | None = None
    store_errors: int = 0

    @property
    def chain_worked(self) -> bool:
        return bool(self.episodes) and all(episode.surprise is None for episode in self.episodes)

    def tables(self) -> tuple[list[Table], list[str]]:
        """One table per environment (fits 80 columns) and the numbered notes under them (``surprise``)."""
        notes: list[str] = []
        tables = []
        for environment in self.plans:
            episodes = [e for e in self.episodes if e.environment == environment.name]
            prefix = f"{environment.name}/"
            width = max([len("task"), *(len(e.task_id.removeprefix(prefix)) for e in episodes)])
            table = report_table(f"{environment.name}: {counted(len(episodes), 'episode')}", (0, 1, 0, 0))
            table.add_column("task", no_wrap=True, min_width=min(width, 36), max_width=36, overflow="ellipsis")
            table.add_column("answer", no_wrap=True)
            table.add_column("verdict", overflow="fold")
            for name in ("turns", "calls", "reward"):
                table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
            for episode in episodes:
                record, shown = episode.record, episode.verdict
                if episode.surprise:
                    notes.append(f"{episode.task_id}: {episode.surprise}")
                    shown = f"[red]{shown}[/red] [{len(notes)}]"
                elif episode.passed:
                    shown = f"[green]{shown}[/green]"
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

    def json(self) -> dict[str, Any]:
        """The environment run as one JSON document (``--json FILE``)."""
        return {
            "chain_worked": self.chain_worked,
            "environments": [p.name for p in self.plans],
            "episode_store": str(self.episode_dir) if self.episode_dir else None,
            "episode_store_step": self.step,
            "episodes": [
                {
                    "environment": episode.environment,
                    "task_id": episode.task_id,
                    "answer": episode.answer,
                    "verdict": episode.verdict,
                    "reward": episode.reward,
                    "problem": episode.surprise,
                    "policy_calls": episode.policy_calls,
                    "nemogym": episode.record.model_dump(mode="json") if episode.record else {},
                }
                for episode in self.episodes
            ],
        }


def shipped_rows(environment: EnvironmentPlan, limit: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The environment's first ``limit`` shipped rows, each as shipped and as ``convert --env`` writes it."""
    text = environment.rows_text()
    if text is None:
        raise GymEnvironmentError(
            f"{environment.name}: nemo-gym ships no example rows for it (no {environment.rows}); "
            "smoke needs them: try an environment that ships some, e.g. --env mcqa"
        )
    rows: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for index, line in enumerate(text.splitlines()):
        if len(rows) == limit:
            break
        if not line.strip():
            continue
        raw = json.loads(line)
        try:
            row = convert_row(raw, environment=environment.name, index=index)
        except ValueError as error:  # the shipped row cannot run as it is
            raise GymEnvironmentError(f"{environment.name}: its shipped row {index + 1} cannot run: {error}") from None
        rows.append((raw, row))
    return rows


def check_environments(names: Sequence[str], judge: Judge | None = None) -> list[EnvironmentPlan]:
    """The plans of ``names``; ``GymEnvironmentError`` naming each that smoke cannot run."""
    plans = plan(names)
    refused = refusals(plans, judge)
    if refused:
        raise GymEnvironmentError("; ".join(refused))
    return plans


def run_environment_smoke(
    names: Sequence[str],
    *,
    state_dir: Path,
    episode_dir: Path | None = None,
    limit: int = 5,
    judge: Judge | None = None,
    policy_base_url: str | None = None,
    progress: Callable[[str], None] | None = None,
    on_episode: Callable[[str], None] | None = None,
) -> EnvironmentSmokeReport:
    """Serve ``names`` and play their shipped rows (``on_episode``: each line); logs stay in ``state_dir``."""
    say = progress or (lambda _line: None)
    plans = check_environments(names, judge)
    report = EnvironmentSmokeReport(plans=plans)
    # (environment, row as converted, label, the turns the scripted policy plays)
    played: list[tuple[EnvironmentPlan, dict[str, Any], str, tuple[Answer, ...]]] = []
    for environment in plans:
        for raw, row in shipped_rows(environment, limit):
            if policy_base_url is not None:
                played.append((environment, row, MODEL, ()))
            else:
                known = answers(environment.resources_server, raw) or {PLAIN: PLAIN_ANSWER}
                played += [(environment, row, label, turns) for label, turns in known.items()]
    venv = ensure_gym_venv("local", progress=say)
    with RecordingPolicy() as policy:
        # An agent server's model calls reach the sample's session through the routing model,
        # which forwards only to the session servers it is given: here, the scripted policy.
        served = urlsplit(policy_base_url or policy.url).netloc
        servers = EnvironmentServers(
            venv, plans, state_dir=state_dir, progress=say, judge=judge, session_servers=[served]
        )
        try:
            servers.start()
            settings = Settings.from_env().with_overrides(
                environments_text=servers.setting(advertised=False),
                rollout_secret=servers.rollout_secret,  # agent rows' ids, signed as the trainer signs them
            )
            if episode_dir is not None:
                settings = settings.with_overrides(episode_dir=str(episode_dir))
            urls = [policy_base_url or policy.session_url(answers=turns) for *_, turns in played]

            def calls(index: int) -> int | None:
                return None if policy_base_url else len(policy.chat_requests(policy.session_id_of(urls[index])))

            def episode(index: int, result: dict[str, Any]) -> EnvironmentEpisode:
                environment, row, label, _ = played[index]
                task_id = row["metadata"]["nemogym_task_id"]
                return EnvironmentEpisode(environment.name, task_id, label, result, calls(index))

            def done(index: int, result: dict[str, Any]) -> None:
                if on_episode is not None:
                    on_episode(episode(index, result).line())

            def extra(index: int, _started: float) -> dict[str, Any]:
                return {"policy_calls": calls(index), "smoke_answer": played[index][2]}

            say(f"running {counted(len(played), 'episode')} of {counted(len(plans), 'environment')}")
            rows = [row for _, row, _, _ in played]
            results = asyncio.run(run_rows(rows, urls, _SAMPLING, settings, done, extra))
            report.episodes = [episode(index, result) for index, result in enumerate(results)]
        finally:
            servers.stop()
    if episode_dir is not None:
        report.episode_dir = episode_dir
        report.step, report.store_errors = file_as_step(episode_dir)
    return report
