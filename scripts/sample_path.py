#!/usr/bin/env python3
"""Which package code one sample runs, traced: the figures of docs/architecture.md's
"One sample's path, measured".

    python scripts/sample_path.py          # Markdown: the doc's tables, then each sample's module calls
    python scripts/sample_path.py --json   # every figure, function and call as JSON

Five samples, each in a fresh interpreter over loopback servers only (a few seconds each): a
real SWE-bench row through ``agent.run`` and a ``/run`` stand-in answering the wheel's real
result; a real mcqa row through the ``simple_agent`` loop (a resources-server stand-in and a
scripted chat policy at Miles' session URL); the SWE row answered with HTTP 500; a blackjack
agent row through its agent's ``/run``; the SWE row through the fully async buffer. Then the
reward hook, the group filter, salvage (where Miles imports) or the buffer, and
``log_rollout`` on the sample, episode store on. The tracer and
the drivers are ``tests/support/sample_path.py`` (``tests/test_sample_path.py`` checks the
doc against them). Runs from a checkout: its ``src/`` and the checkout's ``tests/`` are put
on the path; the package's dependencies must be installed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.support.sample_path import SAMPLES, markdown, measure_fresh  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    arguments = parser.parse_args()
    measurements = [measure_fresh(sample) for sample in SAMPLES]
    if arguments.json:
        print(json.dumps({m.sample: m.to_json() for m in measurements}, indent=2))
    else:
        print(markdown(measurements), end="")


if __name__ == "__main__":
    main()
