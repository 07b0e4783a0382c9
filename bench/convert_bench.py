"""Benchmark: ``miles-nemogym convert`` against the upstream Miles example's conversion.

Not a test (timings are noisy); run it by hand:

    python bench/convert_bench.py                 # 5,000 and 20,000 rows, 3 repeats
    python bench/convert_bench.py --sizes 2000 --repeats 1   # quick look

What it does
- Synthesises SWE-bench-shaped rows (seeded): the real field set, problem statements,
  patches, test patches and hints with long-tailed lengths like SWE-bench's (median
  problem statement ~1.6 kB, patches up to tens of kB), ``FAIL_TO_PASS``/``PASS_TO_PASS``
  as JSON-encoded strings like the HF parquet, written to parquet in 1,000-row groups.
- Runs each converter in its own subprocess (fresh interpreter, so peak RSS is that
  run's alone; measured with ``os.wait4``) and times it from launch to exit, imports
  included, since that is what a user waits for.
- ``ours``: the real CLI, ``python -m miles_nemogym.cli.main convert --quiet``.
- ``upstream``: the approach of radixark/miles
  ``examples/experimental/nemo-gym/download_and_process_data.py`` for a hub dataset,
  re-implemented here from its description: ``datasets.load_dataset`` (non-streaming,
  so the parquet is first materialised into an Arrow cache, here a fresh empty cache
  per run, as on first use) → ``Dataset.to_json`` into a temporary JSONL file → re-read
  that file line by line with ``json.loads`` → add ``subset``/``split`` → ``json.dumps``
  each row to the output. It validates nothing and writes the prompt as a bare string.
- Writes a JSON report to ``bench/reports/convert-<UTC time>.json`` (gitignored) and
  prints rows/s and peak RSS, and their ratios (ours / upstream).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPOS = [
    ("django/django", ["3.0", "3.1", "3.2", "4.0", "4.1", "4.2", "5.0"]),
    ("sympy/sympy", ["1.1", "1.5", "1.7", "1.9", "1.11", "1.12"]),
    ("scikit-learn/scikit-learn", ["0.20", "0.21", "0.22", "1.3"]),
    ("sphinx-doc/sphinx", ["3.5", "4.0", "5.0", "7.2"]),
    ("matplotlib/matplotlib", ["3.3", "3.5", "3.6", "3.7"]),
    ("pytest-dev/pytest", ["5.4", "6.0", "7.0", "8.0"]),
    ("astropy/astropy", ["4.3", "5.0", "5.1", "5.2"]),
    ("pydata/xarray", ["0.12", "2022.03", "2022.06"]),
    ("pylint-dev/pylint", ["2.13", "2.15", "3.0"]),
    ("psf/requests", ["2.0", "2.3", "2.26"]),
    ("mwaskom/seaborn", ["0.12", "0.13"]),
    ("pallets/flask", ["2.0", "2.3"]),
]
_VOCABULARY = (
    "the a of to in is that for when with this not it be on as an error value return function "
    "class method test raise expected should instead but argument default none object type "
    "call list dict string key index file path module import setting field query model form "
    "request response user data result output input config option behaviour regression fix"
)
WORDS = _VOCABULARY.split()
CODE = [
    "    def {w}_{v}(self, {x}):",
    "        return self.{w}({x}, {v}=None)",
    "        if {x} is None:",
    "            raise ValueError('{w} {v}')",
    "    {x} = {w}.{v}({x}, **kwargs)",
    "        for {x} in self.{w}_{v}:",
    "    assert {w}({x}) == {v}",
    "from .{w} import {v}",
]


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def _text(rng: random.Random, target: int) -> str:
    parts: list[str] = []
    size = 0
    while size < target:
        if rng.random() < 0.25:
            block = "\n".join(_code_line(rng) for _ in range(rng.randint(3, 12)))
            part = f"```python\n{block}\n```"
        else:
            part = " ".join(_sentence(rng, rng.randint(6, 22)) for _ in range(rng.randint(1, 5)))
        parts.append(part)
        size += len(part) + 2
    return "\n\n".join(parts)


def _code_line(rng: random.Random) -> str:
    return rng.choice(CODE).format(w=rng.choice(WORDS), v=rng.choice(WORDS), x=rng.choice(WORDS))


def _patch(rng: random.Random, target: int, path: str) -> str:
    lines = [f"diff --git a/{path} b/{path}", f"--- a/{path}", f"+++ b/{path}"]
    size = 0
    while size < target:
        start = rng.randint(1, 3000)
        lines.append(f"@@ -{start},7 +{start},8 @@ def {rng.choice(WORDS)}_{rng.choice(WORDS)}():")
        for _ in range(rng.randint(5, 14)):
            marker = rng.choice(" " * 6 + "+-")
            lines.append(marker + _code_line(rng))
        size = sum(len(line) + 1 for line in lines)
    return "\n".join(lines) + "\n"


def _length(rng: random.Random, median: float, cap: int) -> int:
    # SWE-bench text lengths are long-tailed: lognormal around the median.
    return min(cap, max(80, int(rng.lognormvariate(0, 0.9) * median)))


def synth_row(rng: random.Random, index: int) -> dict[str, Any]:
    repo, versions = rng.choice(REPOS)
    owner, name = repo.split("/")
    module = f"{name.replace('-', '_')}/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py"
    tests = [
        f"tests/test_{rng.choice(WORDS)}.py::Test{rng.choice(WORDS).title()}::test_{rng.choice(WORDS)}_{i}"
        for i in range(rng.randint(1, 400) if rng.random() < 0.8 else rng.randint(400, 1500))
    ]
    fail = tests[: rng.randint(1, min(6, len(tests)))]
    return {
        "repo": repo,
        "instance_id": f"{owner}__{name}-{100000 + index}",
        "base_commit": f"{rng.getrandbits(160):040x}",
        "patch": _patch(rng, _length(rng, 1500, 60_000), module),
        "test_patch": _patch(rng, _length(rng, 2800, 60_000), "tests/" + module),
        "problem_statement": _text(rng, _length(rng, 1600, 40_000)),
        "hints_text": _text(rng, _length(rng, 900, 20_000)) if rng.random() < 0.6 else "",
        "created_at": f"20{rng.randint(15, 23)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}T12:00:00Z",
        "version": rng.choice(versions),
        "FAIL_TO_PASS": json.dumps(fail),
        "PASS_TO_PASS": json.dumps(tests[len(fail) :]),
        "environment_setup_commit": f"{rng.getrandbits(160):040x}",
        "difficulty": rng.choice(["<15 min fix", "15 min - 1 hour", "1-4 hours", ">4 hours"]),
    }


def synthesise(path: Path, rows: int, seed: int = 0) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    writer: pq.ParquetWriter | None = None
    raw_bytes = 0
    for start in range(0, rows, 1000):
        batch = [synth_row(rng, index) for index in range(start, min(rows, start + 1000))]
        raw_bytes += sum(len(json.dumps(row)) for row in batch)
        table = pa.Table.from_pylist(batch)
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table, row_group_size=1000)
    assert writer is not None
    writer.close()
    return {"rows": rows, "parquet_bytes": path.stat().st_size, "mean_row_json_bytes": raw_bytes // rows}


# --- the upstream approach (run in a child process) -----------------------------------


def upstream_convert(input_path: str, output_path: str, split: str, subset: str) -> None:
    """The upstream example's pipeline for a hub dataset, described in the module docstring."""
    from datasets import load_dataset

    dataset = load_dataset("parquet", data_files=input_path, split="train")
    handle, temp = tempfile.mkstemp(suffix=".jsonl")
    os.close(handle)
    try:
        dataset.to_json(temp)
        with open(temp) as source, open(output_path, "w") as sink:
            for line in source:
                instance = json.loads(line)
                metadata = dict(instance)
                metadata["subset"] = subset
                metadata["split"] = split
                sink.write(json.dumps({"prompt": instance.get("problem_statement", ""), "metadata": metadata}) + "\n")
    finally:
        os.unlink(temp)


# --- the harness ------------------------------------------------------------------------


def run_child(command: list[str], env: dict[str, str]) -> dict[str, float]:
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    stderr = child.stderr.read().decode() if child.stderr else ""
    if child.stderr:
        child.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{command[:4]} exited {code}: {stderr[-2000:]}")
    # ru_maxrss is KiB on Linux.
    # CPU seconds are reported too: wall time on a shared machine includes other load.
    return {
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }


def count_lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for _ in handle)


def bench_size(rows: int, repeats: int, work: Path) -> dict[str, Any]:
    data = work / f"SWE-bench_synth-{rows}.parquet"
    info = synthesise(data, rows)
    results: dict[str, list[dict[str, float]]] = {"ours": [], "upstream": []}
    for attempt in range(repeats):
        for impl in ("ours", "upstream") if attempt % 2 == 0 else ("upstream", "ours"):
            output = work / f"out-{impl}-{rows}.jsonl"
            env = dict(os.environ)
            cache = tempfile.mkdtemp(dir=work, prefix="hf-cache-")
            env["HF_DATASETS_CACHE"] = cache  # a cold Arrow cache per run, as on first use
            env["HF_HUB_OFFLINE"] = "1"
            if impl == "ours":
                command = [
                    sys.executable, "-m", "miles_nemogym.cli.main", "convert", "--quiet",
                    "--input", str(data), "--output", str(output), "--subset", "verified",
                ]  # fmt: skip
            else:
                command = [sys.executable, __file__, "_upstream", str(data), str(output)]
            measured = run_child(command, env)
            measured["rows_written"] = count_lines(output)
            if measured["rows_written"] != rows:
                raise RuntimeError(f"{impl} wrote {measured['rows_written']} rows, expected {rows}")
            measured["rows_per_s"] = rows / measured["seconds"]
            measured["rows_per_cpu_s"] = rows / measured["cpu_seconds"]
            results[impl].append(measured)
            output.unlink()
            subprocess.run(["rm", "-rf", cache], check=True)
    data.unlink()
    summary: dict[str, Any] = {"input": info}
    for impl, runs in results.items():
        summary[impl] = {
            "runs": runs,
            "median_rows_per_s": statistics.median(run["rows_per_s"] for run in runs),
            "median_seconds": statistics.median(run["seconds"] for run in runs),
            "median_rows_per_cpu_s": statistics.median(run["rows_per_cpu_s"] for run in runs),
            "max_peak_rss_mib": max(run["peak_rss_mib"] for run in runs),
        }
    summary["throughput_ratio"] = summary["ours"]["median_rows_per_s"] / summary["upstream"]["median_rows_per_s"]
    summary["cpu_throughput_ratio"] = (
        summary["ours"]["median_rows_per_cpu_s"] / summary["upstream"]["median_rows_per_cpu_s"]
    )
    summary["peak_rss_ratio"] = summary["ours"]["max_peak_rss_mib"] / summary["upstream"]["max_peak_rss_mib"]
    return summary


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("miles-nemogym", "datasets", "pyarrow", "pydantic")}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_upstream":
        upstream_convert(sys.argv[2], sys.argv[3], split="test", subset="verified")
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work-dir", type=Path, default=None, help="scratch folder (default: a temp dir)")
    args = parser.parse_args()

    report: dict[str, Any] = {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "versions": versions(),
        "sizes": {},
    }
    with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="convert-bench-") as work:
        for rows in args.sizes:
            print(f"{rows} rows: synthesising and converting ({args.repeats} repeats each)...", flush=True)
            result = bench_size(rows, args.repeats, Path(work))
            report["sizes"][str(rows)] = result
            ours, upstream = result["ours"], result["upstream"]
            for name, numbers in (("ours", ours), ("upstream", upstream)):
                print(
                    f"  {name:9s}{numbers['median_rows_per_s']:8.0f} rows/s "
                    f"({numbers['median_rows_per_cpu_s']:6.0f} rows/CPU-s)  "
                    f"peak RSS {numbers['max_peak_rss_mib']:7.1f} MiB"
                )
            print(
                f"  ratio (ours/upstream): throughput {result['throughput_ratio']:.2f}x "
                f"(CPU {result['cpu_throughput_ratio']:.2f}x), peak RSS {result['peak_rss_ratio']:.2f}x",
                flush=True,
            )
    sizes = sorted(report["sizes"], key=int)
    if len(sizes) >= 2:
        small, large = report["sizes"][sizes[0]], report["sizes"][sizes[-1]]
        report["rss_growth"] = {
            impl: large[impl]["max_peak_rss_mib"] / small[impl]["max_peak_rss_mib"] for impl in ("ours", "upstream")
        }
        print(
            f"peak RSS {sizes[-1]} rows / {sizes[0]} rows: ours {report['rss_growth']['ours']:.2f}x, "
            f"upstream {report['rss_growth']['upstream']:.2f}x"
        )
    reports = Path(__file__).resolve().parent / "reports"
    reports.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = reports / f"convert-{stamp}.json"
    target.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {target}")


if __name__ == "__main__":
    main()
