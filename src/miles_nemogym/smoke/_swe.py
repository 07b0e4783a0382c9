"""``miles-nemogym smoke``: the whole chain on a laptop, no GPU and no Docker, and its report (lines, table, JSON)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rich import box
from rich.padding import PaddingDimensions
from rich.table import Table

from miles_nemogym import agent
from miles_nemogym.data import convert_row
from miles_nemogym.episode.record import SWE_ENVIRONMENT, EpisodeRecord, passed, read_record
from miles_nemogym.gym import wheel as gym_wheel
from miles_nemogym.gym.config import ServeOptions
from miles_nemogym.gym.server import GymServer
from miles_nemogym.gym.venv import ensure_gym_venv
from miles_nemogym.runtime import current
from miles_nemogym.settings import Settings
from miles_nemogym.smoke._policy import RecordingPolicy
from miles_nemogym.store.views import count_text, load, offline_note, reward_text, verdict
from miles_nemogym.transport import close_pools

__all__ = ["SmokeEpisode", "SmokeReport", "expected_offline", "run_smoke"]

# What Miles' rollout would pass as request_kwargs (already renamed to OpenAI names).
_SMOKE_SAMPLING: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 1024, "top_k": 50, "seed": 1234}

# Repos whose SWE-bench eval script (swebench 4.1.0) downloads test requirements: offline, they are set aside.
_NEEDS_NETWORK_REPOS = frozenset({"django/django", "pylint-dev/pylint"})


def expected_offline(repos: Sequence[str]) -> list[int]:
    """Positions of the rows that need network to be graded."""
    return [i for i, repo in enumerate(repos) if repo in _NEEDS_NETWORK_REPOS]


def report_table(title: str, padding: PaddingDimensions) -> Table:
    """A smoke report's table: its title on the left, a rule under the header, no outer edge."""
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=padding, pad_edge=False)


@dataclass
class SmokeEpisode:
    """One row's result: what the agent function returned, plus what the policy saw."""

    instance_id: str
    repo: str
    result: dict[str, Any]
    policy_requests: int | None  # chat requests on its scripted session (None with a real endpoint)

    @property
    def record(self) -> EpisodeRecord | None:
        return read_record(self.result).record

    @property
    def set_aside(self) -> bool:
        record = self.record
        return record is None or record.status != "ok"

    @property
    def verdict(self) -> str:
        record = self.record
        if record is None:
            return "no record"
        swe, won = record.env == SWE_ENVIRONMENT, passed(record, self.result.get("reward"))
        return verdict(masked=self.set_aside, failure_kind=record.failure_kind, swe=swe, passed=won)

    def line(self) -> str:
        """The line printed as the episode finishes (rich markup)."""
        record = self.record
        took = f", {record.elapsed_s:.0f} s" if record else ""
        if record is None or self.set_aside:
            kind = "no network (expected)" if offline_note(record) else (record and record.failure_kind) or "no record"
            return f"[red]✗[/red] {self.instance_id}  set aside: {kind}{took}"
        return (
            f"[green]✓[/green] {self.instance_id}  {self.verdict}: {count_text(record.turns)} turns, "
            f"reward {reward_text(self.result.get('reward'))}{took}"
        )


@dataclass
class SmokeReport:
    LEGEND: ClassVar[str] = (
        "verdict: resolved, unresolved, or the failure kind of an episode set aside (not trained on), "
        "as `episodes` shows it; turns: agent turns the episode's record counts (- when it has none); "
        "calls: requests the policy answered; F2P: FAIL_TO_PASS tests passed/failed."
    )
    episodes: list[SmokeEpisode] = field(default_factory=list)
    data_path: Path | None = None
    results_dir: Path | None = None
    server_log: Path | None = None
    episode_dir: Path | None = None  # the episode store the run wrote
    step: int | None = None  # the train step its episodes are filed under there
    store_errors: int = 0  # episodes or seals the store could not write

    @property
    def chain_worked(self) -> bool:
        """Every episode came back with a record, at least one a valid measurement."""
        records = [episode.record for episode in self.episodes]
        return all(r is not None for r in records) and any(r is not None and not r.mask_sample for r in records)

    def notes(self) -> tuple[list[int | None], list[str]]:
        """Which note each episode points at, and the notes (one per distinct reason, in row order)."""
        texts: dict[str, int] = {}  # each distinct note's number
        numbers: list[int | None] = []
        for episode in self.episodes:
            record = episode.record
            reason = offline_note(record) or (record and record.failure_reason) or "no reason given"
            text = f"{(record and record.failure_kind) or 'no episode record'}: {reason}"
            numbers.append(texts.setdefault(text, len(texts) + 1) if episode.set_aside else None)
        return numbers, list(texts)

    def table(self) -> tuple[Table, list[str]]:
        """The verdict table (fits 80 columns) and its notes."""
        numbers, texts = self.notes()
        width = max([len("instance"), *(len(e.instance_id) for e in self.episodes)])
        table = report_table("smoke: one row per episode, as the trainer stores it", (0, 0))
        table.add_column("instance", no_wrap=True, min_width=width)
        table.add_column("verdict", overflow="fold")  # at 80 columns a note number wraps under its kind
        for name in ("turns", "calls", "patch", "F2P", "reward"):
            table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
        for episode, number in zip(self.episodes, numbers, strict=True):
            record = episode.record
            f2p = record.fail_to_pass if record else None
            applied = record.patch_applied if record else None
            table.add_row(
                episode.instance_id,
                f"[red]{episode.verdict}[/red] [{number}]"
                if episode.set_aside
                else f"[green]{episode.verdict}[/green]",
                count_text(record.turns if record else None),
                "-" if episode.policy_requests is None else str(episode.policy_requests),
                "-" if applied is None else "yes" if applied else "no",
                f"{f2p.passed}/{f2p.failed}" if f2p else "-",
                reward_text(episode.result.get("reward")),
            )
        return table, texts

    def json(self) -> dict[str, Any]:
        """The run as one JSON document (``--json FILE``), for scripts."""
        numbers, texts = self.notes()
        return {
            "chain_worked": self.chain_worked,
            "prompt_data": str(self.data_path) if self.data_path else None,
            "results_dir": str(self.results_dir) if self.results_dir else None,
            "server_log": str(self.server_log) if self.server_log else None,
            "episode_store": str(self.episode_dir) if self.episode_dir else None,
            "episode_store_step": self.step,
            "episodes": [
                {
                    "instance_id": episode.instance_id,
                    "repo": episode.repo,
                    "verdict": episode.verdict,
                    "set_aside": episode.set_aside,
                    "expected_offline": offline_note(episode.record) is not None,
                    "note": texts[number - 1] if number else None,
                    "reward": episode.result.get("reward"),
                    "policy_calls": episode.policy_requests,
                    "nemogym": episode.record.model_dump(mode="json") if episode.record else {},
                }
                for episode, number in zip(self.episodes, numbers, strict=True)
            ],
        }


async def run_rows(
    rows: Sequence[dict[str, Any]],
    session_urls: Sequence[str],
    sampling: dict[str, Any],
    settings: Settings,
    on_done: Callable[[int, dict[str, Any]], None] | None = None,
    store_extra: Callable[[int, float], Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every row through the agent function at once, as Miles' ``agentic_tool_call`` calls it."""

    async def one(index: int, row: dict[str, Any], url: str) -> dict[str, Any]:
        started = time.time()
        result = await agent.run_with_settings(
            settings,
            base_url=url,
            request_kwargs=dict(sampling),
            metadata=dict(row["metadata"]),
            store_extra=None if store_extra is None else lambda: store_extra(index, started),
        )
        if on_done is not None:
            try:
                on_done(index, result)
            except Exception:  # a display problem must not lose the episode's result
                meta = row["metadata"]
                logging.getLogger(__name__).exception(
                    "smoke: reporting %s failed", meta.get("instance_id") or meta.get("nemogym_task_id")
                )
        return result

    try:
        return list(
            await asyncio.gather(
                *(one(i, row, url) for i, (row, url) in enumerate(zip(rows, session_urls, strict=True)))
            )
        )
    finally:
        await close_pools()


def _server_trajectory(results_dir: Path, instance_id: str, since: float) -> Path | None:
    """The newest ``<subset>/<model>/<id>/<id>_<time>_<uuid>.traj.json`` since ``since`` (nemo-gym 0.7.0)."""
    name = instance_id.lower()
    found = []
    for path in results_dir.rglob(f"{name}_*.traj.json"):
        try:
            modified = path.lstat().st_mtime
        except OSError:
            continue
        if path.parent.name == name and modified >= since - 1:
            found.append((modified, path))
    return max(found)[1] if found else None


def file_as_step(episode_dir: Path) -> tuple[int, int]:
    """Seal this run's episodes as the store's next train step (0 when new), close the store: (step, write errors)."""
    steps = [e.step for e in load(episode_dir).episodes if e.role == "train" and e.step is not None]
    step = max(steps, default=-1) + 1
    current().stores.seal_all("train", step)
    store = current().stores.get(str(episode_dir))
    store.flush()
    errors = store.write_errors
    current().stores.close()
    return step, errors


def run_smoke(
    *,
    state_dir: Path,
    episode_dir: Path | None = None,
    trajectories_kept: bool = True,
    limit: int | None = None,
    policy_base_url: str | None = None,
    step_limit: int = 10,
    concurrency: int = 5,
    progress: Callable[[str], None] | None = None,
    on_episode: Callable[[str], None] | None = None,
    on_running: Callable[[int], None] | None = None,
) -> SmokeReport:
    """Serve SWE-bench rows and play them (``on_episode``: each line); the server's files stay in ``state_dir``."""
    say = progress or (lambda _line: None)
    base_settings = Settings.from_env()
    if episode_dir is not None:
        base_settings = base_settings.with_overrides(episode_dir=str(episode_dir))
    data_path = state_dir / "smoke_prompts.jsonl"
    report = SmokeReport(data_path=data_path)
    rows = [convert_row(row) for row in gym_wheel.example_rows()][:limit]  # as Miles prompt rows, kept to see
    data_path.parent.mkdir(parents=True, exist_ok=True)
    data_path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    say(f"converted {len(rows)} SWE-bench Verified rows -> {data_path}")
    options = ServeOptions(sandbox="local", port=0, concurrency=concurrency, step_limit=step_limit)
    venv = ensure_gym_venv(options.sandbox, progress=say)
    say("starting the NeMo-Gym mini_swe_agent_2 server (sandbox: local)")
    with GymServer(options, state_dir=state_dir / "gym", venv=venv, progress=say) as server:
        report.results_dir, report.server_log = server.results_dir, server.log_path
        say(f"server ready at {server.url}")
        settings = base_settings.with_overrides(gym_url=server.url)
        results_dir = server.results_dir

        policy = RecordingPolicy()  # started only when no real endpoint is given
        with policy if policy_base_url is None else contextlib.nullcontext():
            urls = [policy.session_url() for _ in rows] if policy_base_url is None else [policy_base_url] * len(rows)

            def calls(index: int) -> int | None:
                return None if policy_base_url else len(policy.chat_requests(policy.session_id_of(urls[index])))

            def episode(index: int, result: dict[str, Any]) -> SmokeEpisode:
                meta = rows[index]["metadata"]
                return SmokeEpisode(meta["instance_id"], meta["repo"], result, calls(index))

            def done(index: int, result: dict[str, Any]) -> None:
                if on_episode is not None:
                    on_episode(episode(index, result).line())

            def extra(index: int, started: float) -> dict[str, Any]:
                fields: dict[str, Any] = {"policy_calls": calls(index)}
                if trajectories_kept:
                    found = _server_trajectory(results_dir, rows[index]["metadata"]["instance_id"], started)
                    fields["server_trajectory"] = str(found) if found else None
                return fields

            said = "the scripted recording policy" if policy_base_url is None else policy_base_url
            say(f"running {len(rows)} episodes against {said}")
            if on_running:
                on_running(len(rows))
            results = asyncio.run(run_rows(rows, urls, _SMOKE_SAMPLING, settings, done, extra))
            report.episodes = [episode(index, result) for index, result in enumerate(results)]
    if episode_dir is not None:
        report.episode_dir = episode_dir
        report.step, report.store_errors = file_as_step(episode_dir)
    return report
