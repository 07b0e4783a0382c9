"""Benchmark of the episode store: what writing costs, and browsing a large store.

Writes N episodes (default 10,000 in 10 steps) through the real writer, each with one of the
pinned nemo-gym wheel's real ``/run`` results padded to ``--answer-kb`` (84 KB, a real
SWE-bench answer's size) as its answer, sealing and compressing each step. Then, each in a
fresh process as a user runs it:

  table   ``miles-nemogym episodes DIR``: wall time and peak RSS. Goal: <= 3 s, <= 300 MB.
  html    ``miles-nemogym episodes DIR --step S --html OUT`` (one step): wall time. Goal: <= 10 s.
  baseline  with ``--baseline-src``: the table as another checkout's code makes it, side by side.
  zcat    reading every byte of every step's file once (gunzip, line split), the baseline
          the table's time compares with: what a reader that parses no answer still pays
          when it reads them.

The write cost is CPU seconds per episode in this process (``add`` on the calling thread, the
writer thread's appends, sealing and compression), and what that is at 100 episodes a second
as a share of one core.

    python bench/store_bench.py             # 10,000 episodes, ~1-3 minutes
    python bench/store_bench.py --episodes 1000 --steps 2
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from miles_nemogym.episode.record import EpisodeRecord  # noqa: E402
from miles_nemogym.gym import wheel  # noqa: E402
from miles_nemogym.store import EpisodeStore, entry_for  # noqa: E402


def answers(size: int) -> list[bytes]:
    """The wheel's real results, each padded to ``size`` bytes with its own trajectory's text
    (an extra field), so the answers compress as real ones do."""
    out = []
    for result in wheel.example_rollouts():
        raw = json.dumps(result)
        text = json.dumps(result["response"]["output"])
        pad = max(0, size - len(raw) - len(', "pad": ""'))
        out.append(json.dumps({**result, "pad": (text * (pad // len(text) + 1))[:pad]}).encode())
    return out


def write_store(folder: Path, episodes: int, steps: int, size: int) -> dict[str, float]:
    pool = answers(size)
    results = wheel.example_rollouts()
    store = EpisodeStore(folder)
    per_step = episodes // steps
    cpu, started = time.process_time(), time.monotonic()
    add_cpu = 0.0
    for step in range(1, steps + 1):
        for i in range(per_step):
            result = results[i % len(results)]
            record = EpisodeRecord(
                status="ok",
                episode_id=f"s{step}-{i:05d}",
                instance_id=result["instance_id"],
                resolved=bool(result["reward"]),
                attempts=1,
                elapsed_s=30.0,
                turns=12,
            )
            entry = entry_for(record=record, reward=float(result["reward"]), role="train", eval_set=None,
                              session=f"s-{step}-{i}", repo=result["instance_id"].split("__")[0])  # fmt: skip
            before = time.thread_time()
            store.add("train", entry, pool[i % len(pool)], True)
            add_cpu += time.thread_time() - before
        store.seal("train", step, timeout_s=600)
    store.close(timeout_s=600)
    cpu = time.process_time() - cpu
    return {
        "write_wall_s": time.monotonic() - started,
        "write_cpu_ms_per_episode": 1000 * cpu / episodes,
        "add_cpu_us_per_episode": 1e6 * add_cpu / episodes,
        "core_percent_at_100_per_s": 100 * cpu / episodes * 100,
        "store_mb": sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6,
        "write_errors": store.write_errors,
    }


def timed(argv: list[str], src: Path = ROOT / "src") -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, peak RSS MB, stdout) of one fresh process running the
    package in ``src`` (CPU: what other load on the machine barely moves)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    with tempfile.TemporaryFile("w+") as out:
        started = time.monotonic()
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.monotonic() - started
        out.seek(0)
        text = out.read()
    if status != 0:
        raise SystemExit(f"{argv} failed: {text}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, text


def zcat(folder: Path) -> float:
    started = time.monotonic()
    for path in sorted(folder.rglob("*.jsonl.gz")):
        with gzip.open(path, "rb") as handle:
            for _ in handle:
                pass
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--answer-kb", type=float, default=84)
    parser.add_argument("--keep", type=Path, help="Write the store here and keep it (default: a temporary folder).")
    parser.add_argument(
        "--baseline-src", type=Path,
        help="Also run the table with the package in this src folder (another checkout), side by side.",
    )  # fmt: skip
    args = parser.parse_args()
    report: dict[str, Any] = {"episodes": args.episodes, "steps": args.steps, "answer_kb": args.answer_kb}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp) / "episodes"
        report.update(write_store(folder, args.episodes, args.steps, int(args.answer_kb * 1000)))
        cli = [sys.executable, "-m", "miles_nemogym.cli.main", "episodes", str(folder)]
        wall, cpu, rss, out = timed(cli)
        report.update(table_s=wall, table_cpu_s=cpu, table_peak_rss_mb=rss, table_lines=len(out.splitlines()))
        if args.baseline_src:
            wall, cpu, rss, _ = timed(cli, args.baseline_src)
            report.update(baseline_table_s=wall, baseline_table_cpu_s=cpu, baseline_table_peak_rss_mb=rss)
        step = args.steps // 2 or 1
        wall, cpu, rss, out = timed([*cli, "--step", str(step), "--html", str(Path(tmp) / "page.html")])
        report.update(
            html_one_step_cpu_s=cpu,
            html_one_step_s=wall,
            html_peak_rss_mb=rss,
            html_page_mb=(Path(tmp) / "page.html").stat().st_size / 1e6,
        )
        report["zcat_every_answer_s"] = zcat(folder)
    report["load_average_1m"] = os.getloadavg()[0]
    report["cpus"] = os.cpu_count()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
