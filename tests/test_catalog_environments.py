"""The folders of the wheel's ``environments/`` (NeMo-Gym's catalog names ``calendar_v2``,
``wordle``, ...) as environments by their own names; ``resources_servers/NAME`` as ``NAME``; the
13 names both folders have; what ``environments`` says of them; their rows for examples and
convert, and the gold smoke plays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.data._environments import parse_env_option
from miles_nemogym.gym import catalog
from miles_nemogym.gym.catalog import CatalogEntry, entry_support
from miles_nemogym.gym.composition import Judge, server_blocks
from miles_nemogym.gym.environments import catalog_folders, environment_needs, plan, shipped_environments
from miles_nemogym.gym.venv import GymEnvironmentError
from miles_nemogym.gym.wheel import read_member
from miles_nemogym.smoke._answers import GOLD, WRONG, answers

SIMPLE = ("abstention", "arc_agi", "calendar", "calendar_v2", "circle_click", "circle_count", "code_gen", "ether0")
SIMPLE += ("instruction_following", "reasoning_gym", "workplace_assistant")
GYMNASIUM = ("blackjack", "indian_banking", "wordle")
HARNESS = ("opencode_math", "opencode_reasoning_gym", "kilocode_math", "cline_math")


def _kinds(member: str) -> tuple[set[str], set[str]]:
    """(resources server kinds, agent kinds) of a config of the wheel, as shipped."""
    blocks = list(server_blocks(yaml.safe_load(read_member(member))))
    return (
        {kind for _, group, kind, _ in blocks if group == "resources_servers"},
        {kind for _, group, kind, _ in blocks if group == "responses_api_agents"},
    )


def test_the_folders_played_by_simple_agent_gymnasium_agent_or_a_run_harness_are_environments() -> None:
    folders = catalog_folders()
    assert sorted(folders) == sorted((*SIMPLE, *GYMNASIUM, *HARNESS))
    assert "claude_code_math" not in folders and "example_single_tool_call" not in folders


def test_calendar_v2_is_planned_from_its_environments_config_with_its_servers_requirements() -> None:
    [p] = plan(["calendar_v2"])
    assert (p.name, p.config, p.instance) == ("calendar_v2", "environments/calendar_v2/config.yaml", "calendar")
    assert p.resources_server == "calendar" and p.agent is None
    assert p.rows == "environments/calendar_v2/data/example.jsonl"
    assert p.requirements == plan(["calendar"])[0].requirements == ("rich",)  # resources_servers/calendar's
    [routed] = plan(["calendar_v2"], routed=True)
    assert routed.agent == "calendar_simple_agent"


def test_the_catalogs_spelling_of_a_resources_server_is_its_short_name() -> None:
    assert plan(["resources_servers/mcqa", "mcqa"]) == plan(["mcqa"])
    assert parse_env_option("resources_servers/mcqa=rows.jsonl", None).name == "mcqa"
    with pytest.raises(GymEnvironmentError, match="'nope' is not an environment nemo-gym ships"):
        plan(["resources_servers/nope"])


@pytest.mark.parametrize("name", sorted(set(catalog_folders()) & set(shipped_environments())))
def test_a_name_of_both_folders_keeps_the_resources_servers_config_which_pairs_the_same_server_and_agent(
    name: str,
) -> None:
    member = f"resources_servers/{name}/configs/{name}.yaml"
    assert _kinds(member) == _kinds(catalog_folders()[name])
    try:
        [p] = plan([name])
    except GymEnvironmentError as refused:  # refused under either config: the same requirements
        assert name == "instruction_following" and "needs more than PyPI" in str(refused)
        return
    assert p.config == member
    try:
        theirs = read_member(f"environments/{name}/data/example.jsonl")
    except KeyError:
        assert name == "indian_banking"  # its environments/ folder ships no rows; its server's are the ones
        return
    assert theirs == read_member(p.rows)


def test_calendar_and_calendar_v2_share_one_server_instance_so_one_serve_takes_one() -> None:
    with pytest.raises(GymEnvironmentError, match="'calendar' and 'calendar_v2' are both served by instance"):
        plan(["calendar", "calendar_v2"])


def test_environments_reports_the_folders_as_served_refused_or_judged_and_others_not_yet() -> None:
    def entry(name: str) -> CatalogEntry:
        return CatalogEntry(name=name, kind="environment", config=f"environments/{name}/config.yaml")

    assert entry_support(entry("calendar_v2")).status == catalog.SIMPLE
    assert entry_support(entry("blackjack")).status == catalog.ROUTED
    assert entry_support(entry("abstention")).status == catalog.JUDGE
    wordle = entry_support(entry("wordle"))
    assert wordle.status == catalog.REFUSED and "guesses.txt" in wordle.needs
    assert "beyond PyPI" in entry_support(entry("instruction_following")).needs
    assert "user_sim_base_url" in entry_support(entry("indian_banking")).needs
    opencode = entry_support(entry("opencode_math"))
    assert opencode.status == catalog.ROUTED and "to install opencode-ai@1.17.11 once" in opencode.needs
    kilo = entry_support(entry("kilocode_math"))  # the version serve pins over nemo-gym's 7.4.15
    assert kilo.status == catalog.ROUTED and "to install @kilocode/cli@7.7.7 once" in kilo.needs
    cline = entry_support(entry("cline_math"))  # likewise over its 3.0.55
    assert cline.status == catalog.ROUTED and "to install cline@3.0.57 once" in cline.needs


# The five folders of nemo-gym 0.7.0's environments/ no other rule served: each refused for what the
# wheel says it needs, or served as the resources server config it is.
_HYPOTEST = "a requirement beyond PyPI: `hypotest @ git+https://github.com/EdisonScientific/hypotest.git@"
_LAST_FIVE = {
    "aviary_bixbench": (catalog.REFUSED, _HYPOTEST, "its resources server aviary's requirements.txt"),
    "aviary_gsm8k": (catalog.REFUSED, _HYPOTEST, "its resources server aviary's requirements.txt"),
    "aviary_hotpotqa": (catalog.REFUSED, _HYPOTEST, "its resources server aviary's requirements.txt"),
    "nemo_user_sim": (catalog.REFUSED, "a requirement beyond PyPI: `nemo-usersim @ git+https://github.com/", "its re"),
    "example_single_tool_call": (catalog.SIMPLE, "", ""),
}


@pytest.mark.parametrize(("name", "expected"), _LAST_FIVE.items())
def test_the_last_five_folders_are_refused_for_a_requirement_beyond_pypi_or_served_as_their_server(
    name: str, expected: tuple[str, str, str]
) -> None:
    status, why, refusal = expected
    found = entry_support(CatalogEntry(name=name, kind="environment", config=f"environments/{name}/config.yaml"))
    assert found.status == status and found.needs.startswith(why), found
    shown = CliRunner().invoke(app, ["environments", name])
    assert shown.exit_code == 0 and f"here: {status}" in shown.output, shown.output
    if status == catalog.REFUSED:
        with pytest.raises(GymEnvironmentError, match=f"environment '{name}': {refusal}") as refused:
            plan([name])
        assert "needs more than PyPI" in str(refused.value)
    else:
        [served] = plan([name])
        assert served.config == f"resources_servers/{name}/configs/{name}.yaml"


# Each other harness of nemo-gym 0.7.0's environments/, refused for what it lacks here.
_HARNESS_REFUSALS = {
    "claude_code_math": "its CLI (npm `@anthropic-ai/claude-code`) has no pinned version",
    "codex_reasoning_gym": "its CLI (npm `@openai/codex` 0.144.4) sends `include` in every /v1/responses call",
    "openclaw_reasoning_gym": "its CLI (npm `openclaw` 2026.6.11) needs Node.js >= 22.19",
    "pi_math": "its CLI (npm `@earendil-works/pi-coding-agent` 0.80.2) does not start",
    "prime_agent_math": "its CLI installs by a shell script from app.primeintellect.ai (setup_prime_agent.py)",
    "hermes_math": "a requirement beyond PyPI: `hermes-agent @ git+https://github.com/cmunley1/hermes-agent@26bb847a`",
    "nemo_fabric_deepagents_math": "a requirement beyond PyPI: `hermes-agent @ git+https://github.com/NousResearch",
    "simple_strands_reasoning_gym": "a requirement beyond PyPI: `simple-strands-agent @ git+https://github.com/",
    "langgraph_rewoo_math": "its agent `langgraph_agent` drops the rollout id (nemo-gym 0.7.0)",
}


@pytest.mark.parametrize(("name", "why"), _HARNESS_REFUSALS.items())
def test_every_other_harness_environment_is_refused_by_name_with_what_it_lacks(name: str, why: str) -> None:
    def entry(name: str) -> CatalogEntry:
        return CatalogEntry(name=name, kind="environment", config=f"environments/{name}/config.yaml")

    found = entry_support(entry(name))
    assert found.status == catalog.REFUSED and found.needs.startswith(why), found
    with pytest.raises(GymEnvironmentError, match=f"environment '{name}': its agent") as refused:
        plan([name])
    assert "not an environment nemo-gym ships" not in str(refused.value)


@pytest.mark.parametrize(
    "name", ["reasoning_gym_claude_code_agent_model_server", "reasoning_gym_codex_agent_model_server"]
)
def test_a_harness_refused_in_environments_is_refused_in_a_resources_servers_config_too(name: str) -> None:
    # These configs name the same agents as claude_code_math and codex_reasoning_gym; they were listed
    # "routed" and serve started them.
    config = f"resources_servers/reasoning_gym/configs/{name}.yaml"
    found = entry_support(
        CatalogEntry(name=f"resources_servers/reasoning_gym/{name}", kind="environment", config=config)
    )
    assert found.status == catalog.REFUSED and found.needs.startswith("its CLI (npm"), found
    refused = CliRunner().invoke(app, ["serve", "--no-swe", "--env", name, "--dry-run"])
    assert refused.exit_code == 2 and f"environment '{name}': its agent" in refused.output, refused.output


def test_a_resources_server_folder_without_a_server_is_refused_with_its_own_description() -> None:
    # gymnasium ships base.py, a class other servers import, and a config saying so.
    with pytest.raises(GymEnvironmentError) as refused:
        plan(["gymnasium"])
    assert "entrypoint is base.py" in str(refused.value) and "Not a standalone server" in str(refused.value)
    with pytest.raises(GymEnvironmentError, match="is not an environment nemo-gym ships"):
        plan(["gymnasiun"])  # a misspelt name is still told apart from it


def test_the_catalog_list_fits_80_columns_but_a_name_longer_than_the_line() -> None:
    shown = CliRunner().invoke(app, ["environments"], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    over = [line for line in shown.output.splitlines() if len(line) > 80]
    assert all(len(line.split()) == 1 for line in over), over  # a long name alone; its label on the next line
    assert "needs a judge" in shown.output and "eval, prepared file" in shown.output


@pytest.mark.parametrize(
    "name",
    [
        "blackjack",
        "abstention",
        "example_multi_turn_gymnasium",
        # Graded by a judge and played by an agent of their own: serve needs both --judge-url and --session-server.
        "resources_servers/gdp_pdf",
        "resources_servers/deepsearchqa",
        # The benchmark played and graded by that environment.
        "gdp_pdf --kind benchmark",
    ],
)
def test_the_try_it_commands_fit_80_columns_and_run_when_followed(name: str) -> None:
    shown = CliRunner().invoke(app, ["environments", *name.split()], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    tried = shown.output.split("try it:")[1]
    assert all(len(line) <= 80 for line in tried.splitlines()), tried  # (a config's path is never split)
    commands = " ".join(tried.replace("\\\n", " ").split("\n")).split("miles-nemogym ")
    serve = next(c.split() for c in commands if c.startswith("serve "))
    filled = {"URL": "http://127.0.0.1:9/v1", "NAME": "judge-model", "HOST:PORT": "127.0.0.1:30000"}
    # --no-swe: this machine has no Docker for the SWE server serve would start beside it.
    dry = CliRunner().invoke(app, [*(filled.get(word, word) for word in serve), "--no-swe", "--dry-run"])
    assert dry.exit_code == 0, dry.output


def test_no_entry_listed_as_served_needs_what_serve_does_not_configure_for_env_servers() -> None:
    # litmus_agent, terminal_bench_4, vibench, ... were listed as served (with commands to try) while
    # `serve --env NAME --dry-run` reported their sandbox provider missing: no command could serve them.
    shown = CliRunner().invoke(app, ["environments", "--json"])
    assert shown.exit_code == 0, shown.output
    entries = [CatalogEntry.model_validate(item) for item in json.loads(shown.output)]
    judge = Judge(url="http://judge:8000/v1", model="judge-model")
    served = {catalog.SIMPLE, catalog.ROUTED, catalog.JUDGE, catalog.BENCHMARK_SHIPPED, catalog.BENCHMARK_PREPARED}
    listed = [e for e in entries if entry_support(e).status in served]
    assert len(listed) > 200
    unservable = {}
    for entry in listed:
        name = catalog.served_name(entry) if entry.kind == "environment" else catalog.benchmark_grader(entry)[0]
        assert name is not None, entry.name
        never = [need for need in environment_needs(plan([name]), judge) if "serve does not configure" in need]
        if never:
            unservable[entry.name] = never
    assert not unservable, unservable
    for name in ("vibench",):  # a provider its config only names (`sandbox_provider: sandbox`)
        found = entry_support(next(e for e in entries if name in (e.name, e.short_name)))
        assert found.status == catalog.REFUSED, found
        assert found.needs.startswith("task containers: a sandbox provider"), found
        detail = CliRunner().invoke(app, ["environments", name], env={"COLUMNS": "80"})
        assert "here: refused" in detail.output and "try it:" not in detail.output, detail.output
    # One its config connects to itself (opensandbox at ${oc.env:OPENSANDBOX_DOMAIN,...}): the user's to give.
    for name in ("litmus_agent", "terminal_bench_4"):
        found = entry_support(next(e for e in entries if name in (e.name, e.short_name)))
        assert found.status in served and "the sandbox service its config connects to" in found.needs, found


def test_examples_and_convert_take_an_environments_folder_by_name(tmp_path: Path) -> None:
    rows = tmp_path / "calendar_v2.jsonl"
    written = CliRunner().invoke(app, ["examples", "--env", "calendar_v2", "--output", str(rows)])
    assert written.exit_code == 0, written.output
    assert rows.read_bytes().rstrip(b"\n") == read_member("environments/calendar_v2/data/example.jsonl").rstrip(b"\n")
    prompts = tmp_path / "prompts.jsonl"
    done = CliRunner().invoke(app, ["convert", "--env", f"calendar_v2={rows}", "--output", str(prompts)])
    assert done.exit_code == 0, done.output
    marks = {json.loads(line)["metadata"]["nemogym_env"] for line in prompts.read_text().splitlines()}
    assert marks == {"calendar_v2"}
    spelled = CliRunner().invoke(app, ["examples", "--env", "resources_servers/mcqa"])
    assert (
        spelled.exit_code == 0 and spelled.stdout == read_member("resources_servers/mcqa/data/example.jsonl").decode()
    )


@pytest.mark.parametrize(("server", "member"), [("calendar", "calendar_v2"), ("arc_agi", "arc_agi")])
def test_smoke_has_a_gold_and_a_wrong_answer_for_every_shipped_row(server: str, member: str) -> None:
    for line in read_member(f"environments/{member}/data/example.jsonl").decode().splitlines():
        found = answers(server, json.loads(line))
        assert set(found) == {GOLD, WRONG} and found[GOLD] != found[WRONG]
