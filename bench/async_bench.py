"""Throughput benchmark: Miles' synchronous rollout vs its fully async rollout, long-tailed episodes.

Both run Miles' real rollout functions through the integration tests' harness
(``tests/support/miles_harness.py``: session server, router, mock engine, this package's
hooks as the launcher wires them) against the same loopback ``/run`` stand-in, whose episodes
call the policy once and then take a log-normal time (median ``--median``, p99/p50 ``--tail``;
drawn in arrival order from one seed, so both modes see the same sequence of times).

    sync    ``InferenceRolloutFn``: ``--steps`` train steps; each waits for its slowest group,
            then the (stand-in) training step runs while nothing generates
    async   ``FullyAsyncRolloutFn`` with ``miles_nemogym.buffer.EpisodeBuffer``: ``--steps``
            drains, the (stand-in) training step after each while the worker keeps generating

Same concurrency: ``--prompts`` groups of ``--samples`` in flight (Miles' default for both).
The training step is ``--train`` seconds of sleep (no GPU here). Reported per mode: trained
samples per second of wall time (rollout + training steps), and the rollout side's idle
fraction: 1 - (seconds the server spent on episodes) / (concurrency x wall time).

    python bench/async_bench.py                   # 4 prompts x 4 samples, 4 steps, 2 rounds (ABAB...)
    python bench/async_bench.py --rounds 1 --steps 2

Needs the Miles venv the integration tests build (MILES_SRC names the pinned Miles source).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from yield_bench import BUFFER, prompt_rows  # noqa: E402

from miles_nemogym.gym import wheel as gym_wheel  # noqa: E402
from tests.support.miles_env import ensure_miles_env  # noqa: E402
from tests.support.miles_harness import MilesDriver  # noqa: E402
from tests.support.scripted_gym import ScriptedGym  # noqa: E402
from tests.support.threaded import serving_in_thread  # noqa: E402

GOAL = 2.0


class LogNormalTimes:
    """Episode times in ``/run`` arrival order: log-normal, median ``median``, p99/p50 ``tail``."""

    def __init__(self, median: float, tail: float, seed: int) -> None:
        self._mu, self._sigma = math.log(median), math.log(tail) / 2.3263  # z of the 99th percentile
        self._rng = random.Random(seed)

    def __call__(self, body: dict[str, Any]) -> float:
        return self._rng.lognormvariate(self._mu, self._sigma)


def _gym(options: argparse.Namespace, seed: int) -> ScriptedGym:
    result = next(r for r in gym_wheel.example_rollouts() if r["instance_id"].startswith("sympy"))
    times = LogNormalTimes(options.median, options.tail, seed)
    return ScriptedGym(result=result, policy_calls=1, seed=seed, hold_s_for=times)


def _busy(gym: ScriptedGym, since: float, until: float) -> float:
    return sum(max(0.0, min(end, until) - max(start, since)) for start, end in gym.spans)


def run_sync(driver: MilesDriver, rows: list[dict[str, Any]], options: argparse.Namespace, seed: int) -> dict[str, Any]:
    gym = _gym(options, seed)
    wall = 0.0
    trained = 0
    with serving_in_thread(gym):
        for k in range(options.steps):
            step = driver.step(
                gym_url=gym.url, rows=rows, n_prompts=options.prompts, n_samples=options.samples,
                rollout_id=k, time_limit_s=600,
            ).check()  # fmt: skip
            wall += float(step.raw["rollout_call_s"]) + options.train  # training after the rollout: nothing generates
            trained += sum(1 for mask in step.train_data["loss_masks"] if any(mask))
    busy = _busy(gym, 0.0, math.inf)  # every /run ran inside a step's rollout call
    return _summary("sync", trained, wall, busy, options)


def run_async(
    driver: MilesDriver, rows: list[dict[str, Any]], options: argparse.Namespace, seed: int
) -> dict[str, Any]:
    gym = _gym(options, seed)
    with serving_in_thread(gym):
        run = driver.step(
            gym_url=gym.url, rows=rows, n_prompts=options.prompts, n_samples=options.samples,
            drains=options.steps, extra_argv=BUFFER, train_s=options.train, drain_limit_s=300, time_limit_s=900,
        ).check()  # fmt: skip
        ended = time.monotonic()
    drains = run.drains
    for drain in drains:
        drain.check()
    wall = sum(float(d.raw["elapsed_s"]) for d in drains)
    # The drains ran back to back and ended just before the reply: the window is the last `wall` seconds.
    first = ended - (run.elapsed_s - float(run.raw["rollout_s"])) - wall
    busy = _busy(gym, first, first + wall)
    trained = sum(1 for d in drains for mask in d.train_data["loss_masks"] if any(mask))
    return _summary("async", trained, wall, busy, options)


def _summary(mode: str, trained: int, wall: float, busy: float, options: argparse.Namespace) -> dict[str, Any]:
    slots = options.prompts * options.samples
    return {
        "mode": mode,
        "trained_samples": trained,
        "wall_s": round(wall, 2),
        "samples_per_s": trained / wall if wall else 0.0,
        "rollout_idle_fraction": max(0.0, 1 - busy / (slots * wall)) if wall else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4, help="--rollout-batch-size (groups in flight)")
    parser.add_argument("--samples", type=int, default=4, help="--n-samples-per-prompt")
    parser.add_argument("--steps", type=int, default=4, help="train steps (sync) / drains (async) per round")
    parser.add_argument("--rounds", type=int, default=2, help="sync then async, this many times (ABAB)")
    parser.add_argument("--median", type=float, default=2.0, help="median episode time, s")
    parser.add_argument("--tail", type=float, default=20.0, help="p99 / p50 of the episode times")
    parser.add_argument("--train", type=float, default=1.0, help="stand-in training step, s")
    parser.add_argument("--out", type=Path, default=None, help="report JSON (default: bench/reports/)")
    options = parser.parse_args()

    env = ensure_miles_env(progress=lambda line: print(f"[miles-env] {line}", file=sys.stderr))
    driver = MilesDriver(env, log_path=Path(tempfile.mkdtemp(prefix="async-bench-")) / "driver.log")
    rows = prompt_rows(max(16, options.prompts * 2))
    results = []
    try:
        for round_ in range(options.rounds):
            for measure in (run_sync, run_async):
                row = {"round": round_, **measure(driver, rows, options, seed=round_ + 1)}
                results.append(row)
                print(json.dumps(row), flush=True)
    finally:
        driver.close()
    ratios = []
    for round_ in range(options.rounds):
        sync, fully = (next(r for r in results if (r["round"], r["mode"]) == (round_, m)) for m in ("sync", "async"))
        ratios.append(fully["samples_per_s"] / sync["samples_per_s"] if sync["samples_per_s"] else 0.0)
    print(f"\n{options.prompts} prompts x {options.samples} samples, {options.steps} steps per round, log-normal")
    print(f"episode times (median {options.median} s, p99/p50 {options.tail}), {options.train} s training step")
    print("| mode | trained samples/s (mean, min-max over rounds) | rollout idle fraction (mean) |")
    print("|---|---:|---:|")
    for mode in ("sync", "async"):
        rates = [r["samples_per_s"] for r in results if r["mode"] == mode]
        idle = statistics.fmean(r["rollout_idle_fraction"] for r in results if r["mode"] == mode)
        print(f"| {mode} | {statistics.fmean(rates):.2f} ({min(rates):.2f}-{max(rates):.2f}) | {idle:.2f} |")
    verdict = "ok" if min(ratios) >= GOAL else f"below {GOAL}"
    print(f"async / sync per round: {', '.join(f'{r:.2f}' for r in ratios)} ({verdict})")
    report = options.out or ROOT / "bench" / "reports" / f"async_bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(
        json.dumps({"options": {**vars(options), "out": str(report)}, "results": results, "ratios": ratios}, indent=2)
    )
    print(f"report: {report}")


if __name__ == "__main__":
    main()
