"""Benchmarks of NeMo-Gym's catalog played by another agent than ``simple_agent``: each is converted
for the environment whose agent plays it the same, or refused for what its config needs (nemo-gym
0.7.0's own reasons: task containers, a requirement beyond PyPI, an agent that drops the rollout id,
...), read from the wheel by the rules ``serve`` refuses environments with. The entries are built as
``gym list environments`` gives them (``tests/integration/test_environments_cli.py`` checks the whole
catalog)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.gym import benchmarks, catalog
from miles_nemogym.gym.benchmarks import BenchmarkError, benchmark_mark
from miles_nemogym.gym.catalog import CatalogDataset, CatalogEntry, benchmark_grader, entry_support
from miles_nemogym.gym.composition import refusal, shipped_config
from miles_nemogym.gym.environments import config_refusal, plan
from miles_nemogym.gym.venv import GymEnvironmentError, GymVenv
from tests.support.stand_in_gym import wheel_only_cache


def benchmark(name: str, agent: str | None, server: str | None, config: str, repeats: int = 1) -> CatalogEntry:
    data = f"benchmarks/{name.split('/')[0]}/data/{name.split('/')[0]}_benchmark.jsonl"
    return CatalogEntry(
        name=name,
        kind="benchmark",
        config=config,
        agent=agent,
        agent_server=agent,
        resources_server=server,
        datasets=(CatalogDataset(name=name, type="benchmark", jsonl_fpath=data, num_repeats=repeats),),
        reward_range=(0.0, 1.0),
        higher_is_better=True,
    )


GDP_PDF = benchmark("gdp_pdf", "gdp_pdf_agent", "gdp_pdf", "benchmarks/gdp_pdf/config.yaml", repeats=5)


def test_a_benchmark_whose_config_is_its_environments_is_converted_for_it_and_routed_to_its_agent() -> None:
    assert benchmark_grader(GDP_PDF)[0] == "gdp_pdf"
    found = entry_support(GDP_PDF)
    assert (found.status, found.agent) == (catalog.BENCHMARK_PREPARED, "`gdp_pdf_agent`")
    assert "played and graded by `gdp_pdf` (routed to its agent)" in found.needs
    assert "a judge (`--judge-url`)" in found.needs and "a vision-language policy" in found.needs
    mark = benchmark_mark(GDP_PDF)
    assert (mark.environment, mark.num_repeats) == ("gdp_pdf", 5)
    [p] = plan(["gdp_pdf"])
    assert p.agent == "gdp_pdf_simple_agent"  # serve --env gdp_pdf routes its rows to this agent's /run


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (
            benchmark("tau2/configs/tau2", "tau2", None, "benchmarks/tau2/configs/tau2.yaml"),
            "a requirement beyond PyPI: `tau2[knowledge] @ git+https://github.com/",
        ),
        (
            benchmark(
                "finance_sec_search/config_web_search",
                "finance_agent",
                "finance_sec_search",
                "benchmarks/finance_sec_search/config_web_search.yaml",
            ),
            "its agent `finance_agent` drops the rollout id",
        ),
        (
            benchmark("labbench2_vlm", "labbench2_vlm_agent", "labbench2_vlm", "benchmarks/labbench2_vlm/config.yaml"),
            "its agent `labbench2_vlm_agent` drops the rollout id",
        ),
        (
            benchmark("toolsandbox", "toolsandbox_agent", "toolsandbox", "benchmarks/toolsandbox/config.yaml"),
            "its resources server calls `policy_model` itself (`user_model_server`)",
        ),
        (
            benchmark(
                "speed-bench/config_qualitative",
                "speed_bench_agent",
                "speed_bench",
                "benchmarks/speed-bench/config_qualitative.yaml",
            ),
            "its resources server reads the policy's own server (`vllm_base_url`)",
        ),
        (
            benchmark("gdpval", "stirrup_agent", "gdpval", "benchmarks/gdpval/config.yaml"),
            "its own rollout driver `resources_servers.gdpval.multistage_orchestrator:run_rollout_collection`",
        ),
        (
            benchmark("critpt", "critpt_agent", "critpt", "benchmarks/critpt/config.yaml"),
            "its environment `critpt`: settings serve does not set: `artificial_analysis_api_key`",
        ),
    ],
    ids=lambda value: value.name if isinstance(value, CatalogEntry) else "",
)
def test_a_benchmark_is_refused_with_nemo_gyms_reason(entry: CatalogEntry, reason: str) -> None:
    found = entry_support(entry)
    assert found.status == catalog.REFUSED and reason in found.needs, found
    assert found.agent == f"`{entry.agent_server}`"
    with pytest.raises(BenchmarkError, match="does not run here"):
        benchmark_mark(entry)


@pytest.mark.parametrize(
    ("name", "config", "needs"),
    [
        (
            "deepsearchqa/configs/deepsearchqa_opencode",
            "benchmarks/deepsearchqa/configs/deepsearchqa_opencode.yaml",
            ["the environment variable EXA_API_KEY", "a judge (`--judge-url`)"],
        ),
        ("swebench/verified/opencode", "benchmarks/swebench/verified/opencode.yaml", []),
        (
            "apex_shortlist/opencode",
            "benchmarks/apex_shortlist/opencode.yaml",
            ["the environment variable OPENCODE_SANDBOX_IMAGE"],
        ),
        ("job_bench/pi", "benchmarks/job_bench/pi.yaml", []),
    ],
)
def test_a_benchmark_in_task_containers_is_refused_first_for_them_naming_what_else_it_needs(
    name: str, config: str, needs: list[str]
) -> None:
    kind = "harness_exa_search" if name.startswith("deepsearchqa") else None
    found = entry_support(benchmark(name, kind, None, config))
    assert found.status == catalog.REFUSED
    assert found.needs.startswith("task containers: a sandbox provider"), found.needs
    for need in needs:
        assert need in found.needs, found.needs


def test_a_benchmark_whose_server_reads_a_file_the_wheel_does_not_ship_is_refused_as_wordle_is() -> None:
    # scicode's benchmark config points its server at SciCode's test data, staged by hand.
    scicode = benchmark("scicode", "scicode_agent", "scicode", "benchmarks/scicode/config.yaml", repeats=8)
    assert benchmark_grader(scicode)[0] is None
    found = entry_support(scicode)
    assert found.status == catalog.REFUSED
    assert found.needs == "a file the wheel does not ship: `benchmarks/scicode/data/test_data.h5`"
    # The rule reads the setting: a file the wheel holds, or none (the environment's own config), is fine.
    server = {"scicode": {"resources_servers": {"scicode": {"test_data_fpath": None}}}}
    assert refusal("scicode", server, None) is None
    shipped = "benchmarks/scicode/config.yaml"
    server["scicode"]["resources_servers"]["scicode"]["test_data_fpath"] = shipped
    assert refusal("scicode", server, None) is None
    server["scicode"]["resources_servers"]["scicode"]["test_data_fpath"] = "benchmarks/scicode/data/none.h5"
    assert "reads benchmarks/scicode/data/none.h5 (its test_data_fpath)" in str(refusal("scicode", server, None))


def test_environments_folders_and_benchmarks_are_refused_by_one_rule() -> None:
    # A requirement beyond PyPI of an agent (tau2's git line) refuses a benchmark as it refuses a folder.
    tau2 = shipped_config("benchmarks/tau2/configs/tau2.yaml")
    assert "needs more than PyPI" in str(config_refusal("tau2/configs/tau2", tau2))
    # The agent that drops the rollout id refuses the environment of its name as it refuses its benchmark.
    [p] = plan(["labbench2_vlm"])
    assert "re-reads the row" in str(refusal("labbench2_vlm", shipped_config(p.config), None))
    assert catalog.support("labbench2_vlm").status == catalog.REFUSED


def test_convert_builds_the_server_venv_for_a_benchmark_name_before_a_first_serve_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A benchmark's rows need nemo-gym's catalog and prompt config: with no server venv yet, convert
    builds it rather than reading ``gdp_pdf=FILE`` as the environment's rows, unmarked."""
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(wheel_only_cache(tmp_path)))
    builds: list[str] = []

    def build(sandbox: str = "local", progress: Any = None, python: Any = None) -> GymVenv:
        builds.append(sandbox)
        raise GymEnvironmentError("no Python 3.13 on this machine")

    monkeypatch.setattr(benchmarks, "ensure_gym_venv", build)
    rows = tmp_path / "prepared.jsonl"
    rows.write_text(json.dumps({"responses_create_params": {"input": "2+2?"}, "verifier_metadata": {}}) + "\n")
    done = CliRunner().invoke(app, ["convert", "--env", f"gdp_pdf={rows}", "-o", str(tmp_path / "out.jsonl")])
    assert (done.exit_code, builds) == (1, ["local"]), done.output
    assert f"--env gdp_pdf={rows}: no Python 3.13 on this machine" in " ".join(done.output.split())
    assert not (tmp_path / "out.jsonl").exists()


def test_convert_of_an_environments_rows_never_builds_the_server_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(wheel_only_cache(tmp_path)))
    monkeypatch.setattr(benchmarks, "ensure_gym_venv", lambda *_, **__: pytest.fail("built the server venv"))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"responses_create_params": {"input": "2+2?"}, "verifier_metadata": {}}) + "\n")
    done = CliRunner().invoke(app, ["convert", "--env", f"mcqa={rows}", "-o", str(tmp_path / "out.jsonl"), "-q"])
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "out.jsonl").read_text())["metadata"]["nemogym_env"] == "mcqa"


def test_a_benchmark_whose_config_connects_to_its_own_sandbox_service_names_it_as_a_need() -> None:
    # terminal_bench_4's opensandbox block, nested in its environment: ${oc.env:OPENSANDBOX_DOMAIN,localhost}.
    found = entry_support(benchmark("terminal_bench_4/miniswe", None, None, "benchmarks/terminal_bench_4/miniswe.yaml"))
    assert found.status != catalog.REFUSED and "the sandbox service its config connects to" in found.needs, found
