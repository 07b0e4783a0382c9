"""NeMo-Gym benchmarks as held-out evaluation rows. Why and how: docs/environments.md, "Benchmarks"."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from miles_nemogym.episode.record import BENCHMARK_KEY
from miles_nemogym.gym import wheel as gym_wheel
from miles_nemogym.gym.catalog import (
    CatalogEntry,
    UnknownCatalogNameError,
    benchmark_grader,
    entry_support,
    find,
    load_catalog,
)
from miles_nemogym.gym.venv import GymEnvironmentError, GymVenv, Progress, cached_gym_venv, ensure_gym_venv, run_in_gym

__all__ = ["file_benchmark", "find_benchmark"]

_MATERIALIZE = """
import sys
from nemo_gym.prompt import materialize_prompts
materialize_prompts(sys.argv[1], sys.argv[2], sys.argv[3])
"""


class BenchmarkError(GymEnvironmentError):
    """A benchmark that cannot become rows here; the message names why and the fix."""


class BenchmarkMark(BaseModel):
    """What each row of a benchmark carries (``metadata.nemogym_benchmark``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    environment: str
    """The environment (``serve --env`` name) whose resources server grades it."""
    num_repeats: int = 1
    reward_range: tuple[float, float] | None = None
    higher_is_better: bool | None = None


def benchmark_mark(entry: CatalogEntry) -> BenchmarkMark:
    """The mark of ``entry``'s rows; ``BenchmarkError`` if this package does not run it."""
    environment = benchmark_grader(entry)[0]
    if environment is None:
        raise BenchmarkError(f"benchmark {entry.name!r} does not run here: {entry_support(entry).needs}")
    return BenchmarkMark(
        name=entry.name,
        environment=environment,
        num_repeats=entry.num_repeats or 1,
        reward_range=entry.reward_range,
        higher_is_better=entry.higher_is_better,
    )


def file_benchmark(path: Path) -> BenchmarkMark | None:
    """The benchmark whose rows ``path`` holds (its first row's mark), else None."""
    try:
        with path.open(encoding="utf-8") as rows:
            first = next((line for line in rows if line.strip()), "")
        metadata = json.loads(first).get("metadata") if first else None
        mark = metadata.get(BENCHMARK_KEY) if isinstance(metadata, dict) else None
        return BenchmarkMark.model_validate(mark) if isinstance(mark, dict) else None
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None  # an unreadable file is the launcher's checks' to name


@dataclass(frozen=True)
class Benchmark:
    """A benchmark of the catalog of ``gym``'s nemo-gym."""

    gym: GymVenv
    entry: CatalogEntry

    def shipped_data(self) -> Path | None:
        """Its prepared file when the nemo-gym wheel ships it."""
        path = self.gym.site_packages / self.entry.data_file if self.entry.data_file else None
        return path if path is not None and path.is_file() else None

    def rows(self, source: Path, output: Path) -> BenchmarkMark:
        """Write ``source``'s rows to ``output`` with its prompt config applied (by nemo-gym's
        ``materialize_prompts`` in :attr:`gym`) and its mark added; that mark."""
        entry = self.entry
        mark = benchmark_mark(entry)
        prompt = entry.prompt_config or next((d.prompt_config for d in entry.datasets if d.prompt_config), None)
        with tempfile.TemporaryDirectory(prefix="mng-bench-") as scratch:
            rendered = Path(scratch) / "rendered.jsonl"
            if prompt is None:
                rendered = source  # rows that carry their own input
            else:
                done = run_in_gym(self.gym, _MATERIALIZE, [str(source.resolve()), prompt, str(rendered)])
                if done.returncode != 0:
                    tail = done.stderr.strip().splitlines()[-1:] or ["(no message)"]
                    raise BenchmarkError(
                        f"--env {entry.name}={source}: nemo-gym could not apply the benchmark's prompt config "
                        f"{entry.prompt_config}: {tail[0]}; "
                        f"give the file `gym eval prepare --benchmark {entry.name}` writes"
                    )
            rows = [json.loads(line) for line in rendered.read_text(encoding="utf-8").splitlines() if line.strip()]
        marked = mark.model_dump(mode="json")
        with output.open("w", encoding="utf-8") as out:
            for row in rows:  # not a mapping: convert names the bad row
                out.write(json.dumps({**row, BENCHMARK_KEY: marked} if isinstance(row, dict) else row) + "\n")
        return mark


def find_benchmark(name: str, progress: Progress, *, strict: bool) -> Benchmark | None:
    """The benchmark ``name`` names, else None; the server venv is built only for a name with benchmark files.
    ``strict``: ``UnknownCatalogNameError``, naming the close ones, for a name the catalog lacks."""
    gym = cached_gym_venv()
    if gym is None:
        if not any(gym_wheel.ships(f"benchmarks/{name}{tail}") for tail in (".yaml", "/config.yaml", "/manifest.yaml")):
            return None
        gym = ensure_gym_venv(progress=progress)
    entries = load_catalog(gym)
    try:
        entry = find(name, entries, "benchmark")
    except UnknownCatalogNameError:
        if strict:
            find(name, entries)  # not a benchmark, but an environment's name?
        return None
    return Benchmark(gym, entry) if entry.name == name else None
