"""What a scan shows: live progress, one line per finished instance, the final summary."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from miles_nemogym import fit
from miles_nemogym.episode.record import percentile
from miles_nemogym.errors import counted
from miles_nemogym.scan._results import ResultLine, Verdict
from miles_nemogym.store.views import reward_text

__all__ = ["ScanProgress", "header", "render_summary"]

_STATUS_EVERY = 10
_STATUS_INTERVAL_S = 60.0

_LABELS = {Verdict.passed: "[green]PASS [/]", Verdict.failed: "[red]FAIL [/]", Verdict.infra: "[yellow]INFRA[/]"}


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    infra: int = 0
    seconds: list[float] = field(default_factory=list)

    def add(self, result: ResultLine) -> None:
        setattr(self, result.verdict.value, getattr(self, result.verdict.value) + 1)
        self.seconds.append(result.seconds)

    @property
    def done(self) -> int:
        return self.passed + self.failed + self.infra

    @property
    def mean_s(self) -> float | None:
        return sum(self.seconds) / len(self.seconds) if self.seconds else None

    @property
    def p95_s(self) -> float | None:
        """Nearest-rank 95th percentile: a time some episode actually took."""
        return percentile(self.seconds, 95) if self.seconds else None


def _rewards_text(result: ResultLine) -> str:
    """The reward; a golden environment row's gold and wrong rewards: ``1.0 (wrong 0.0)``."""
    reward = reward_text(result.reward)
    return reward if result.wrong_reward is None else f"{reward} (wrong {reward_text(result.wrong_reward)})"


def _clock(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def header(pending: int, selected: int, where: str, how: str) -> str:
    """The scan's first lines, within 80 columns: what runs where (a URL whole), then ``how``."""
    said = f"scan: {pending} of {counted(selected, 'selected instance')} to run on {where}"
    return "\n".join([*fit.wrap([said], fit.MIN_WIDTH, indent="  "), f"  {how}"])


class ScanProgress:
    """Live progress of one scan (a context manager around the run)."""

    def __init__(self, console: Console, total: int, already_done: Iterable[ResultLine]) -> None:
        self.console = console
        self.total = total
        self.counts = Counts()
        for result in already_done:
            self.counts.add(result)
        self._started_with = self.counts.done
        self._started = time.monotonic()
        self._last_status = self._started
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if console.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]scan"),
                BarColumn(bar_width=20),
                TextColumn("{task.completed}/{task.total} done:"),
                TextColumn("{task.description}"),
                TextColumn("elapsed"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console,
            )
            self._task = self._progress.add_task(self._counts_text(), total=total, completed=self.counts.done)

    def __enter__(self) -> ScanProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def _counts_text(self) -> str:
        return (
            f"[green]{self.counts.passed} passed[/], [red]{self.counts.failed} failed[/], "
            f"[yellow]{self.counts.infra} infra[/]"
        )

    def status_line(self) -> str:
        """done/total, the three counts, elapsed and ETA, as one plain line."""
        elapsed = time.monotonic() - self._started
        ran = self.counts.done - self._started_with
        remaining = self.total - self.counts.done
        eta = _clock(elapsed / ran * remaining) if ran else "?"
        return (
            f"progress {self.counts.done}/{self.total} done: {self.counts.passed} passed, "
            f"{self.counts.failed} failed, {self.counts.infra} infra failures; elapsed {_clock(elapsed)}, ETA {eta}"
        )

    def finished(self, result: ResultLine) -> None:
        """Count one finished instance and print its line."""
        self.counts.add(result)
        kind = "-" if result.verdict is Verdict.passed else (result.failure_kind or "unresolved")
        width = len(str(self.total))
        line = (
            f"\\[{self.counts.done:>{width}}/{self.total}] {_LABELS[result.verdict]} "
            f"{escape(result.instance_id)}  reward {_rewards_text(result)}  {escape(kind)}  "
            f"{result.seconds:.1f}s"
        )
        if result.reason:
            reason = result.reason.removeprefix(f"{kind}: ")
            line += f"  [dim]{escape(reason)}[/]"
        self.console.print(line, soft_wrap=not self.console.is_terminal, highlight=False)
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, description=self._counts_text())
            return
        now = time.monotonic()
        if self.counts.done % _STATUS_EVERY == 0 or now - self._last_status >= _STATUS_INTERVAL_S:
            self._last_status = now
            self.console.print(self.status_line(), soft_wrap=True, highlight=False)


def _kinds(results: list[ResultLine], *, by_environment: bool) -> list[str]:
    """``not passed, by kind: failed 3, ...``, environment rows' a line per environment (``mcqa: ...``)."""
    counted: dict[str, Counter[str]] = {}
    for result in results:
        if result.verdict is not Verdict.passed:
            where = (result.environment or "?") if by_environment else ""
            counted.setdefault(where, Counter())[result.failure_kind or "unresolved"] += 1
    return [
        f"{where + ': ' if where else ''}not passed, by kind: "
        + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items(), key=lambda item: (-item[1], item[0])))
        for where, kinds in sorted(counted.items())
    ]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render_summary(
    console: Console, results: list[ResultLine], *, selected: int, earlier: int, golden: bool, interrupted: bool
) -> None:
    """The per-repo (or per-environment) and overall table, then each instance that did not pass and why."""
    by_repo: dict[str, Counts] = {}
    overall = Counts()
    for result in results:
        by_repo.setdefault(result.environment or result.repo, Counts()).add(result)
        overall.add(result)

    group = "environment" if any(result.environment for result in results) else "repo"
    columns = [group, "instances", "passed", "failed", "infra", "mean s", "p95 s"]
    rows = [(repo, by_repo[repo]) for repo in sorted(by_repo)]

    def cells(name: str, counts: Counts) -> list[str]:
        numbers = (counts.done, counts.passed, counts.failed, counts.infra)
        return [name, *map(str, numbers), _seconds(counts.mean_s), _seconds(counts.p95_s)]

    # Too wide for the terminal: the times go first (p95, then mean); counts and repos stay whole.
    for kept in (7, 6, 5):
        table = Table(title="NeMo-Gym scan summary", title_justify="left")
        for name in columns[:kept]:
            table.add_column(name, justify="left" if name == group else "right", no_wrap=True)
        for repo, counts in rows:
            table.add_row(*cells(escape(repo), counts)[:kept])  # the input's text, never markup
        table.add_section()
        table.add_row(*cells("overall", overall)[:kept], style="bold")
        if Measurement.get(console, console.options.update_width(10_000), table).maximum <= console.width:
            break
    console.print(table)

    notes = _kinds(results, by_environment=group == "environment")
    if earlier:
        notes.append(f"{counted(earlier, 'result')} from an earlier run of this results file (--resume)")
    not_run = selected - overall.done
    if not_run:
        why = " (interrupted)" if interrupted else ""
        notes.append(f"{not_run} of {counted(selected, 'selected instance')} not run{why}")
    for note in notes:
        console.print(note, soft_wrap=not console.is_terminal, highlight=False)

    shown = [r for r in results if r.verdict is Verdict.infra or (golden and r.verdict is Verdict.failed)]
    if shown:
        if not golden:
            title = "infrastructure failures"
        elif group == "environment":
            title = "not passed (golden mode: each gold answer passes, each wrong one does not)"
        else:
            title = "not 1.0 (golden mode expects 1.0 everywhere)"
        console.print(f"[bold]{counted(len(shown), 'instance')} {title}:[/]", highlight=False)
        for result in sorted(shown, key=lambda item: item.instance_id):
            line = f"  {result.instance_id}  reward {_rewards_text(result)}  {result.reason or '?'}"
            # On a terminal, continuations indented under the id; in a log, one whole line.
            for piece in fit.wrap([line], console.width, indent="    ") if console.is_terminal else [line]:
                console.print(piece, soft_wrap=True, markup=False, highlight=False)
