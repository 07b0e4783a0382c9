"""Yield benchmark: trained samples per paid episode, dropping vs salvaging partly failed groups.

Each measurement is one of Miles' real train rollout steps (``tests/support/miles_harness.py``:
Miles' ``InferenceRolloutFn``, session server, router and mock engine, this package's hooks as
the launcher wires them, then Miles' ``convert_samples_to_train_data`` with our reward
post-process hook). The Gym side is a loopback server where p of the episodes fail (exactly,
spread evenly over the ``/run`` calls; ``--random-failures`` draws each instead), the others
call the policy once and score 0 or 1 at random. Two kinds of failure:

    after   the episode called the policy, then the server answered ``{error, traceback}``:
            Miles returns a sample carrying our record
    start   HTTP 500 before any policy call (a sandbox that could not start): Miles returns
            an ABORTED copy of the input sample, which the group filter gives its episode back

    paid episodes   every /run the server received (dropped groups and over-sampling included)
    trained samples samples Miles trains with a non-zero loss
    yield           trained samples / paid episodes

``drop`` is ``NEMO_GYM_MIN_VALID_PER_GROUP=0`` (a group with any failure is dropped and Miles
draws another prompt), ``salvage`` the default 2, ``async`` salvage under Miles' fully async
rollout (``FullyAsyncRolloutFn`` with ``miles_nemogym.buffer.EpisodeBuffer``, ``--drains`` train
calls; its worker keeps generating, so paid there counts the episodes the drains decided:
trained, set aside, or dropped by the buffer, not those still running or buffered at the
end). Goal: salvage and async yield >= 0.97 x (1 - p).

    python bench/yield_bench.py                 # both kinds; p = 5, 10, 20 %; 8 prompts x 8 samples
    python bench/yield_bench.py --failures start --rates 0.1 --prompts 4

Needs the Miles venv the integration tests build (MILES_SRC names the pinned Miles source).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from miles_nemogym.data import convert_row  # noqa: E402
from miles_nemogym.gym import wheel as gym_wheel  # noqa: E402
from tests.support.miles_env import ensure_miles_env  # noqa: E402
from tests.support.miles_harness import MilesDriver  # noqa: E402
from tests.support.scripted_gym import ScriptedGym  # noqa: E402
from tests.support.threaded import serving_in_thread  # noqa: E402

MODES = {"drop": "0", "salvage": "2", "async": "2"}
BUFFER = ["--custom-async-data-buffer-path", "miles_nemogym.buffer.EpisodeBuffer"]
FAILURES = ("start", "after")
GOAL = 0.97


def prompt_rows(count: int) -> list[dict[str, Any]]:
    """``count`` distinct prompts: the wheel's rows under distinct instance ids."""
    base = [convert_row(row) for row in gym_wheel.example_rows()]
    rows = []
    for i in range(count):
        row = json.loads(json.dumps(base[i % len(base)]))
        row["metadata"]["instance_id"] = f"{row['metadata']['instance_id']}--{i}"
        rows.append(row)
    return rows


def measure(
    driver: MilesDriver,
    rows: list[dict[str, Any]],
    *,
    failure: str,
    rate: float,
    mode: str,
    prompts: int,
    samples: int,
    seed: int,
    even: bool,
    drains: int = 2,
) -> dict[str, Any]:
    result_doc = next(r for r in gym_wheel.example_rollouts() if r["instance_id"].startswith("sympy"))
    rates = {"start_fail_rate": rate} if failure == "start" else {"fail_rate": rate}
    gym = ScriptedGym(result=result_doc, policy_calls=1, seed=seed, even=even, **rates)
    if mode == "async":
        return _measure_async(driver, gym, rows, failure, rate, prompts, samples, drains)
    with serving_in_thread(gym):
        step = driver.step(
            gym_url=gym.url, rows=rows, n_prompts=prompts, n_samples=samples,
            env={"NEMO_GYM_MIN_VALID_PER_GROUP": MODES[mode]}, time_limit_s=900,
        )  # fmt: skip
        paid = len(gym.bodies)
    step.check()
    masks = step.train_data["loss_masks"]
    trained = sum(1 for mask in masks if any(mask))
    tracked = step.tracked("rollout/step")
    return {
        "failure": failure,
        "rate": rate,
        "mode": mode,
        "paid_episodes": paid,
        "trained_samples": trained,
        "yield": trained / paid if paid else 0.0,
        "failed_episodes": round(tracked.get("nemogym/failure_rate", 0.0) * tracked.get("nemogym/episodes", 0.0)),
        "groups_dropped": tracked.get("nemogym/groups_dropped"),
        "groups_salvaged": tracked.get("nemogym/groups_salvaged"),
        "step_s": round(step.elapsed_s, 1),
    }


def _measure_async(
    driver: MilesDriver, gym: ScriptedGym, rows: list[dict[str, Any]], failure: str, rate: float,
    prompts: int, samples: int, drains: int,
) -> dict[str, Any]:  # fmt: skip
    with serving_in_thread(gym):
        run = driver.step(
            gym_url=gym.url, rows=rows, n_prompts=prompts, n_samples=samples, drains=drains,
            extra_argv=BUFFER, drain_limit_s=300, time_limit_s=900,
        ).check()  # fmt: skip
        sent = len(gym.bodies)
    done = run.drains
    for drain in done:
        drain.check()
    trained = sum(1 for d in done for mask in d.train_data["loss_masks"] if any(mask))
    tracked = [d.tracked("rollout/step") for d in done]
    decided = sum(len(d.train_data["loss_masks"]) for d in done)  # trained groups, zero-loss samples included
    decided += int(sum(t.get("nemogym/buffer/episodes_dropped", 0.0) for t in tracked))
    return {
        "failure": failure,
        "rate": rate,
        "mode": "async",
        "paid_episodes": decided,
        "sent_episodes": sent,
        "trained_samples": trained,
        "yield": trained / decided if decided else 0.0,
        "groups_dropped": sum(t.get("nemogym/groups_dropped", 0.0) for t in tracked),
        "groups_salvaged": sum(t.get("nemogym/groups_salvaged", 0.0) for t in tracked),
        "step_s": round(run.elapsed_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--failures", nargs="+", choices=FAILURES, default=list(FAILURES))
    parser.add_argument("--rates", type=float, nargs="+", default=[0.05, 0.10, 0.20])
    parser.add_argument("--prompts", type=int, default=8, help="--rollout-batch-size")
    parser.add_argument("--samples", type=int, default=8, help="--n-samples-per-prompt")
    parser.add_argument("--seeds", type=int, default=2, help="steps per cell, each with its own random draws")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--drains", type=int, default=2, help="async: train calls per run")
    parser.add_argument(
        "--random-failures",
        action="store_true",
        help="draw each episode's failure at random (default: exactly p of the /run calls, evenly spread)",
    )
    options = parser.parse_args()

    env = ensure_miles_env(progress=lambda line: print(f"[miles-env] {line}", file=sys.stderr))
    log = Path(tempfile.mkdtemp(prefix="yield-bench-")) / "driver.log"
    driver = MilesDriver(env, log_path=log)
    rows = prompt_rows(max(64, options.prompts * 8))
    results = []
    try:
        for failure in options.failures:
            for rate in options.rates:
                for mode in options.modes:
                    for seed in range(1, options.seeds + 1):
                        row = measure(
                            driver, rows, failure=failure, rate=rate, mode=mode, prompts=options.prompts,
                            samples=options.samples, seed=seed, even=not options.random_failures,
                            drains=options.drains,
                        )  # fmt: skip
                        results.append(row)
                        print(json.dumps(row), flush=True)
    finally:
        driver.close()
    shape = f"{options.prompts} prompts x {options.samples} samples per step"
    print(f"\n{shape}, {options.seeds} Miles train steps per cell")
    heads = " | ".join(f"{mode}: paid | trained | yield" for mode in options.modes)
    goals = " | ".join(f"{mode} / (1 - p)" for mode in options.modes if mode != "drop")
    print(f"| failure | rate p | {heads} | {goals} |")
    print(
        "|---|---:|"
        + "---:|---:|---:|" * len(options.modes)
        + "---:|" * (len(options.modes) - ("drop" in options.modes))
    )
    for failure in options.failures:
        for rate in options.rates:
            cells = {}
            for mode in options.modes:
                of = [r for r in results if (r["failure"], r["rate"], r["mode"]) == (failure, rate, mode)]
                paid = sum(r["paid_episodes"] for r in of)
                trained = sum(r["trained_samples"] for r in of)
                cells[mode] = (paid, trained, trained / paid if paid else 0.0)
            ratios = []
            for mode, (_, _, y) in cells.items():
                if mode != "drop":
                    ratio = y / (1 - rate)
                    ratios.append(f"{ratio:.3f} ({'ok' if ratio >= GOAL else f'below {GOAL}'})")
            text = " | ".join(f"{paid} | {trained} | {y:.3f}" for paid, trained, y in cells.values())
            print(f"| {failure} | {rate:.0%} | {text} | {' | '.join(ratios)} |")
    report = ROOT / "bench" / "reports" / f"yield_bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps({"options": vars(options), "results": results}, indent=2))
    print(f"report: {report}")


if __name__ == "__main__":
    main()
