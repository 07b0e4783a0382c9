"""Benchmarks whose own config changes their grader (``gpqa`` sets mcqa's ``grading_mode``) are
served by their own names from that config, and what ``environments`` says of them (from the
wheel; the real servers grading with those settings: tests/integration/test_benchmarks.py)."""

from __future__ import annotations

import pytest

from miles_nemogym.gym import catalog
from miles_nemogym.gym.catalog import CatalogEntry, benchmark_grader, entry_support
from miles_nemogym.gym.composition import JUDGE_INSTANCE, Judge, inherited_config, layer
from miles_nemogym.gym.environments import (
    benchmark_environments,
    example_rows_member,
    plan,
    plan_config,
    refusals,
)
from miles_nemogym.gym.venv import GymEnvironmentError

JUDGE = Judge(url="http://judge:8000/v1", model="judge")


def _entry(name: str) -> CatalogEntry:
    """Benchmark ``name`` as the catalog gives it (its manifest's agent and resources server)."""
    config = benchmark_environments().get(name.replace("/", "."), (name, f"benchmarks/{name}/config.yaml"))[1]
    server = {"gpqa": "mcqa", "arxivmath_0526": "math_with_judge", "aime25": "math_with_judge"}.get(name, "x")
    return CatalogEntry(
        name=name, kind="benchmark", config=config, agent_server="simple_agent", resources_server=server
    )


def test_every_simple_agent_benchmark_whose_config_changes_its_grader_has_an_environment_name() -> None:
    found = benchmark_environments()
    assert len(found) == 52
    assert found["gpqa"] == ("gpqa", "benchmarks/gpqa/config.yaml")
    assert found["apex25.config_with_system"] == (
        "apex25/config_with_system",
        "benchmarks/apex25/config_with_system.yaml",
    )
    # A name an environment has gets a suffix; the environment keeps its name.
    for name in ("aalcr", "lmarena_v2", "lmarena_v3", "polymath"):
        assert found[f"{name}.benchmark"][0] == name and name not in found
    assert "aime25" not in found  # its config leaves math_with_judge as it is: served by that name


def test_a_benchmark_is_planned_from_its_own_config_on_the_server_its_simple_agent_plays() -> None:
    [gpqa] = plan(["gpqa"])
    assert (gpqa.name, gpqa.config, gpqa.instance) == (
        "gpqa",
        "benchmarks/gpqa/config.yaml",
        "gpqa_mcqa_resources_server",
    )
    assert gpqa.resources_server == "mcqa" and gpqa.max_steps == 1 and gpqa.agent is None
    assert gpqa.requirements == plan(["mcqa"])[0].requirements
    assert plan(["apex25/config_with_system"]) == plan(["apex25.config_with_system"])
    assert plan(["aalcr"])[0].config == "resources_servers/aalcr/configs/aalcr.yaml"  # the environment
    assert plan(["aalcr.benchmark"])[0].config == "benchmarks/aalcr/config.yaml"
    assert plan(["gpqa"], routed=True)[0].agent == "gpqa_mcqa_simple_agent"
    assert example_rows_member("gpqa") == "benchmarks/gpqa/data/example.jsonl"  # looked for there (none ships)


def test_its_config_is_read_with_the_instance_it_inherits_moved_into_it() -> None:
    config = inherited_config("benchmarks/gpqa/config.yaml")
    block = config["gpqa_mcqa_resources_server"]["resources_servers"]["mcqa"]
    assert block["grading_mode"] == "lenient_answer_colon_md" and block["entrypoint"] == "app.py"
    assert "mcqa" not in config and "_inherit_from" not in config["gpqa_mcqa_resources_server"]
    assert plan_config(plan(["gpqa"])[0]) == config


def test_a_benchmark_and_the_environment_it_inherits_are_not_served_together() -> None:
    with pytest.raises(GymEnvironmentError, match=r"environments 'mcqa' and 'gpqa'.*serve them with one serve each"):
        plan(["mcqa", "gpqa"])
    assert [p.name for p in plan(["gpqa", "mmlu"])] == ["gpqa", "mmlu"]  # both inherit mcqa: each its copy


def test_a_benchmark_whose_config_turns_a_judge_on_gets_the_judge_handling() -> None:
    [arxiv] = plan(["arxivmath_0526"])
    [reason] = refusals([arxiv], None)
    assert "grades with a judge model" in reason and "--judge-url" in reason
    assert refusals([arxiv], JUDGE) == []
    over = layer([plan_config(arxiv)], JUDGE)
    grader = over["arxivmath_0526_math_with_judge_resources_server"]["resources_servers"]["math_with_judge"]
    assert grader["judge_model_server"] == {"name": JUDGE_INSTANCE}
    assert refusals(plan(["gpqa", "aime25-x"]), None) == []  # aime25-x turns its judge off


def test_such_a_benchmark_runs_here_graded_by_its_own_environment() -> None:
    gpqa = entry_support(_entry("gpqa"))
    assert gpqa.status == catalog.BENCHMARK_PREPARED
    assert gpqa.needs.startswith("graded by `gpqa` (`mcqa` with its config's `grading_mode`); its prepared file")
    assert benchmark_grader(_entry("gpqa"))[0] == "gpqa"
    arxiv = entry_support(_entry("arxivmath_0526"))
    assert arxiv.status == catalog.BENCHMARK_PREPARED and "a judge (`--judge-url`)" in arxiv.needs
    assert benchmark_grader(_entry("aime25"))[0] == "math_with_judge"  # unchanged grader: its own name
    assert entry_support(_entry("aime25")).needs.startswith("graded by `math_with_judge`;")


def test_none_of_them_is_left_not_served() -> None:
    found = {name: entry_support(_entry(name)) for _, (name, _) in benchmark_environments().items()}
    statuses = {name: support.status for name, support in found.items()}
    assert catalog.NOT_YET not in statuses.values(), statuses
    assert set(statuses.values()) == {catalog.BENCHMARK_PREPARED}
    # litmus-bench's grader runs its tools in the sandbox service its own config connects to: a need.
    assert "the sandbox service its config connects to" in found["litmus-bench"].needs
