"""Smoke tests of bench/agent_bench.py, bench/simple_agent_bench.py and bench/routing_bench.py: tiny runs
end to end, so the benchmarks cannot rot.

Each starts the real loopback servers and runs every client; it asserts the report's shape
and that every measurement is a positive number, never a timing bound (timings on a shared
machine are noise).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench  # a slow tier: left out of `-m "not integration"` (tests/support/tiers.py)

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "agent_bench.py"
CLIENTS = ("a", "b", "c", "d")
N, BURST = 24, 12


def test_agent_bench_quick_run_reports_every_client_and_scenario(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--n", str(N), "--concurrency", "6",
         "--burst", str(BURST), "--hold", "0.3", "--warmup", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())

    assert set(report["results"]) == {"saturation", "burst"}
    for scenario in ("saturation", "burst"):
        summaries = report["results"][scenario]
        assert set(summaries) == set(CLIENTS), scenario
        for client, summary in summaries.items():
            where = f"{scenario}/{client}"
            assert summary["errors"] == 0, where
            for key in ("calls_per_s", "wall_s", "client_cpu_per_call_ms", "server_peak_in_flight"):
                assert summary[key] > 0, f"{where}: {key}={summary[key]}"
            measured = [run for run in report["runs"] if (run["scenario"], run["client"]) == (scenario, client)]
            assert all(run["ticks"] > 0 for run in measured), where  # the stall ticker ran beside the calls
            assert summary["worst_stall_max_s"] == max(run["worst_stall_s"] for run in measured), where

    runs = report["runs"]
    assert {(run["scenario"], run["client"]) for run in runs} == {
        (scenario, client) for scenario in ("saturation", "burst") for client in CLIENTS
    }
    for run in runs:
        expected = N if run["scenario"] == "saturation" else BURST
        # Every call came back as a decoded result, and the server saw every one of them.
        assert run["ok"] == expected, run
        assert run["server_served"] == expected, run

    assert [goal["goal"] for goal in report["goals"]] == [
        "saturation a/b >= 0.8",
        "saturation a/c >= 3",
        "burst wall(a) <= 1.2 x wall(b)",
        "burst worst stall of a <= 1 s",
    ]
    assert all(goal["value"] > 0 for goal in report["goals"])
    assert report["server"]["body_bytes"] > 1000


SIMPLE_AGENT_SCRIPT = SCRIPT.parent / "simple_agent_bench.py"


@pytest.mark.integration  # starts real NeMo-Gym servers from the cached server venv
def test_simple_agent_bench_quick_run_reports_overhead_and_both_servers(tmp_path: Path) -> None:
    """Every client (our loop, NeMo-Gym's ``/run``, the bare calls) scored 1.0 on both the
    real server and the stand-in (the script asserts each episode's reward), and the report
    holds every figure, each a positive number with the load it was measured at."""
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(SIMPLE_AGENT_SCRIPT), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())

    overhead = report["overhead"]
    for measure in ("wall_ms_per_turn", "cpu_ms_per_turn"):
        assert set(overhead[measure]) == {"a", "c", "a_minus_c"}
        assert overhead[measure]["a"]["median"] > 0 and overhead[measure]["c"]["median"] > 0, measure
    assert set(report["throughput"]) == {"stand_in", "real"}
    for server, figures in report["throughput"].items():
        for name in ("a", "b", "c"):
            assert figures["episodes_per_s"][name]["median"] > 0, (server, name)
            assert figures["client_cpu_ms_per_episode"][name]["median"] > 0, (server, name)
        assert figures["ratio_a_over_b"]["median"] > 0, server
        assert len(figures["load"]) == 2, server
    assert "a/b" in done.stdout and "ms per turn" in done.stdout


ROUTING_SCRIPT = SCRIPT.parent / "routing_bench.py"


@pytest.mark.integration  # starts real NeMo-Gym servers (and the routing model) from the cached server venv
def test_routing_bench_quick_run_reports_the_hop_and_routed_throughput(tmp_path: Path) -> None:
    """Every call through the routing model answered (chat and Responses) and every episode, in the
    loop and routed through simple_agent's /run, scored 1.0 (the script asserts each); the report
    holds each figure with the load it was measured at."""
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(ROUTING_SCRIPT), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    hop = report["hop"]
    assert set(hop["ms_per_call"]) == {"direct", "routed_chat", "routed_responses"}
    assert all(spread["median"] > 0 for spread in hop["ms_per_call"].values())
    throughput = report["throughput"]
    assert throughput["episodes_per_s"]["loop"]["median"] > 0 and throughput["episodes_per_s"]["routed"]["median"] > 0
    assert throughput["ratio_routed_over_loop"]["median"] > 0 and len(throughput["load"]) == 2
    assert "routed/loop" in done.stdout
