"""A config of a resources server with several, named as NeMo-Gym's catalog spells it
(``resources_servers/NAME/CONFIG``) or by its short name ``CONFIG``, everywhere an environment is
named (serve, examples, convert, NEMO_GYM_ENVS, rows, the launcher); a SWE config holding two
resources servers and no agent refused with the reason and the configs to serve instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.episode.record import Task
from miles_nemogym.gym import catalog
from miles_nemogym.gym.catalog import CatalogEntry, entry_support
from miles_nemogym.gym.environments import plan
from miles_nemogym.gym.venv import GymEnvironmentError
from miles_nemogym.gym.wheel import read_member
from miles_nemogym.launcher.run import load
from miles_nemogym.settings import EnvironmentServer, parse_environments, short_name

NL2BASH = "resources_servers/equivalence_llm_judge/nl2bash-equivalency"


@pytest.mark.parametrize(
    ("said", "short"),
    [
        ("resources_servers/mcqa", "mcqa"),
        ("resources_servers/arena/lmarena_v2", "lmarena_v2"),
        (NL2BASH, "nl2bash-equivalency"),
        ("resources_servers/a/b/c", "resources_servers/a/b/c"),
        ("resources_servers/", "resources_servers/"),
        ("resources_servers/arena/", "resources_servers/arena/"),
        ("swebench/verified/opencode", "swebench/verified/opencode"),
        ("calendar_v2", "calendar_v2"),
    ],
)
def test_the_short_name_of_a_catalog_spelling_is_its_last_part(said: str, short: str) -> None:
    assert short_name(said) == short


def test_a_catalog_config_is_planned_from_that_config_with_its_own_example_rows() -> None:
    [p] = plan([NL2BASH])
    assert (p.name, p.config) == (
        "nl2bash-equivalency",
        "resources_servers/equivalence_llm_judge/configs/nl2bash-equivalency.yaml",
    )
    assert (
        p.rows == "resources_servers/equivalence_llm_judge/data/example_nl2bash.jsonl"
    )  # not the server's example.jsonl
    assert plan(["nl2bash-equivalency"]) == [p]
    [inductive] = plan(["resources_servers/nvarc/inductive"])
    assert (inductive.instance, inductive.agent) == ("nvarc_inductive_resources_server", None)


def test_examples_and_convert_take_a_catalog_config_by_name(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    written = CliRunner().invoke(app, ["examples", "--env", NL2BASH, "--output", str(rows)])
    assert written.exit_code == 0, written.output
    shipped = read_member("resources_servers/equivalence_llm_judge/data/example_nl2bash.jsonl")
    assert rows.read_bytes().rstrip(b"\n") == shipped.rstrip(b"\n")
    prompts = tmp_path / "prompts.jsonl"
    done = CliRunner().invoke(app, ["convert", "--env", f"{NL2BASH}={rows}", "--output", str(prompts)])
    assert done.exit_code == 0, done.output
    marks = {json.loads(line)["metadata"]["nemogym_env"] for line in prompts.read_text().splitlines()}
    assert marks == {"nl2bash-equivalency"}


def _serve(*arguments: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["serve", "--sandbox", "local", *arguments])
    return result.exit_code, " ".join(result.stderr.split())  # rich wraps long lines


def test_a_swe_config_of_two_servers_and_no_agent_is_refused_naming_the_configs_that_pair_one() -> None:
    code, said = _serve("--env", "swe_rebench")
    assert code == 2
    assert (
        "resources_servers/swe_rebench/configs/swe_rebench.yaml holds 2 swe_rebench resources servers "
        "(swe_rebench_resources_server, swe_rebench_golden_patch_resources_server) and no agent playing one"
    ) in said
    assert "nemo-gym's own catalog lists a config only when an agent in it has datasets" in said
    assert (
        "swe_rebench_example (swe_rebench_golden_patch_resources_server), "
        "swe_rebench_opencode (swe_rebench_resources_server)"
    ) in said
    refused = entry_support(CatalogEntry(name="resources_servers/swe_rebench", kind="environment", config="x.yaml"))
    assert refused.status == catalog.REFUSED and "no agent (not in nemo-gym's catalog)" in refused.needs


def test_the_configs_pairing_a_swe_server_with_its_agent_are_planned_on_that_server() -> None:
    [training] = plan(["swe_rebench_opencode"])
    assert (training.instance, training.agent) == (
        "swe_rebench_resources_server",
        "swe_rebench_opencode_sandboxed_agent",
    )
    [golden] = plan(["resources_servers/swe_rebench/swe_rebench_example"])
    assert (golden.instance, golden.agent) == ("swe_rebench_golden_patch_resources_server", None)
    assert golden.rows == "resources_servers/swe_rebench/data/example.jsonl"


def test_a_misspelled_catalog_config_and_a_server_with_several_configs_name_the_fix() -> None:
    code, said = _serve("--env", "resources_servers/arena/nope")
    assert code == 2 and "'resources_servers/arena/nope' is not a config nemo-gym ships" in said
    with pytest.raises(GymEnvironmentError, match=r"no resources_servers/nvarc/configs/lmarena_v2\.yaml"):
        plan(["resources_servers/nvarc/lmarena_v2"])  # a config of another server
    code, said = _serve("--env", "structured_outputs")
    assert code == 2
    assert "resources_servers/structured_outputs/structured_outputs_json, " in said


def test_a_catalog_config_is_served_unless_refused_for_what_it_needs() -> None:
    def entry(name: str) -> CatalogEntry:
        return CatalogEntry(name=name, kind="environment", config="x.yaml")

    assert entry_support(entry("resources_servers/nvarc/inductive")).status == catalog.SIMPLE
    assert entry_support(entry("resources_servers/arena/lmarena_v2")).status == catalog.JUDGE
    assert "beyond PyPI" in entry_support(entry("resources_servers/openenv/openenv_echo")).needs


def test_nemo_gym_envs_keys_and_row_marks_take_the_catalog_spelling(clean_env: None) -> None:
    assert parse_environments('{"resources_servers/arena/lmarena_v2": "http://h:1"}') == {
        "lmarena_v2": EnvironmentServer(url="http://h:1")
    }
    with pytest.raises(ValueError, match="'resources_servers/mcqa' and 'mcqa' name one environment, 'mcqa'"):
        parse_environments('{"resources_servers/mcqa": "http://h:1", "mcqa": "http://h:2"}')
    assert Task.of({"nemogym_env": "resources_servers/mcqa"}).environment == "mcqa"
    config, _, _ = load(
        [
            "--nemo-gym-env", "resources_servers/mcqa=http://gym:8001",
            "--nemo-gym-env", f"{NL2BASH}=http://gym:8002",
            "--eval-data", "resources_servers/mcqa=eval/mcqa.jsonl",
            "--tools-not-served", "resources_servers/mcqa",
        ]
    )  # fmt: skip
    assert sorted(config.nemo_gym_envs) == ["mcqa", "nl2bash-equivalency"]
    assert list(config.eval_data) == ["mcqa"] and config.tools_not_served == ["mcqa"]
