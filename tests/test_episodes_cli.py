"""``miles-nemogym episodes``: the per-step table, filters, one episode, the HTML page, and
all of them per environment."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.store.views import OFFLINE_REASON, load
from tests.support.episode_stores import FAILED_IDS, build_env_store, build_failed_store
from tests.support.hostile_store import entry, write_step


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, ["episodes", *map(str, args)])


def test_table_per_step_and_role(wheel_store: Path, gym_example_rollouts: list[dict[str, Any]]) -> None:
    result = CliRunner().invoke(app, ["episodes", str(wheel_store)], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == [
        "role", "step", "episodes", "valid", "resolve rate", "mean turns", "mean s", "failures by kind"
    ]  # fmt: skip
    resolved = sum(1 for r in gym_example_rollouts if r["reward"] == 1.0)
    n = len(gym_example_rollouts)
    assert re.split(r"\s{2,}", lines[1]) == [
        "eval",
        "1",
        "2",
        "2",
        f"{100 * float(gym_example_rollouts[0]['reward']):.1f}%",
        "3.0",
        "30.0",
        "-",
    ]
    assert re.split(r"\s{2,}", lines[2]) == [
        "train",
        "1",
        str(n + 1),
        str(n),
        f"{resolved / n:.1%}",
        "3.0",
        f"{(30.0 * n + 2.0) / (n + 1):.1f}",
        "agent_run_error 1",
    ]
    assert lines[3].split()[:4] == ["train", "pending", "1", "1"]


def test_filters_list_the_matching_episodes(wheel_store: Path, gym_example_rollouts: list[dict[str, Any]]) -> None:
    first = gym_example_rollouts[0]["instance_id"]
    result = invoke(wheel_store, "--instance", first, "--step", "1")
    assert _listed(result.output) == ["eval0", "eval1", "train0", "crash0"]
    assert _listed(invoke(wheel_store, "--kind", "agent_run_error").output) == ["crash0"]
    assert gym_example_rollouts[0]["reward"] == 1.0  # the wheel's first result is resolved
    assert _listed(invoke(wheel_store, "--kind", "resolved", "--instance", first).output) == [
        "eval0",
        "eval1",
        "train0",
    ]
    none = CliRunner().invoke(app, ["episodes", str(wheel_store), "--kind", "unresolved", "--instance", first])
    assert none.exit_code == 0 and none.stdout == ""
    assert none.stderr == f"no episodes match --instance {first} --kind unresolved (of 9 in {wheel_store})\n"


def _listed(output: str) -> list[str]:
    """The episode ids of the list printed after the tables (after the last blank line, under
    its header); a line wrapped to fit the terminal continues indented."""
    header, *lines = output.rsplit("\n\n", 1)[1].splitlines()
    assert header.split()[0] == "episode"
    return [line.split()[0] for line in lines if line[:1].strip()]


def test_show_renders_turns_patch_and_report(wheel_store: Path, gym_example_rollouts: list[dict[str, Any]]) -> None:
    result_json = gym_example_rollouts[0]
    out = invoke(wheel_store, "--show", "train0").output
    assert out.startswith(
        f"episode train0   instance {result_json['instance_id']}\ntrain   step 1   session s-train0\n"
    )
    first_call = next(i for i in result_json["response"]["output"] if i["type"] == "function_call")
    assert "  $ " + json.loads(first_call["arguments"])["command"] in out
    assert "--- turn 1\nthought:\n<think>" in out
    assert result_json["metadata"]["model_patch"].strip() in out
    assert "--- test report\nresolved: " in out and "FAIL_TO_PASS: " in out
    crashed = invoke(wheel_store, "--show", "crash0").output
    assert "failure: agent_run_error: HTTP 500: boom" in crashed and "Internal Server Error" in crashed
    missing = invoke(wheel_store, "--show", "nope")
    assert missing.exit_code == 2 and "no episode has that id; --list prints every episode's id" in missing.output


def test_html_page_is_self_contained(wheel_store: Path, tmp_path: Path) -> None:
    page = tmp_path / "episodes.html"
    result = invoke(wheel_store, "--html", page)
    assert result.exit_code == 0 and "wrote" in result.output
    text = page.read_text()
    assert text.count("<details>") == 9  # 6 train + 2 eval + 1 pending
    assert text.count('<svg width="520"') == 4  # resolve rate + failure kinds, per role
    assert "http://" not in text.replace("http://127", "") and "<script" not in text
    assert "agent_run_error 1" in text


def test_a_reward_reads_the_same_in_the_list_show_and_page(tmp_path: Path) -> None:
    """store.views.reward_text: a partial reward to 4 decimals, not as stored; a non-number as ``-``."""
    store = tmp_path / "store"
    write_step(store, "train", 1, [entry("third", reward=1 / 3), entry("odd", reward="many")])
    listed = _rows(invoke(store, "--step", "1").stdout.rsplit("\n\n", 1)[1])  # a warning names the odd one
    assert [(row[0], row[-3]) for row in listed[1:]] == [("third", "0.3333"), ("odd", "-")]
    assert "   reward 0.3333   " in invoke(store, "--show", "third").stdout
    assert "   reward -   " in invoke(store, "--show", "odd").stdout
    page = tmp_path / "page.html"
    assert invoke(store, "--html", page).exit_code == 0
    text = page.read_text()
    assert " · reward 0.3333 · " in text and " · reward - · " in text and "0.33333" not in text


def test_not_a_folder_names_the_fix(tmp_path: Path) -> None:
    result = invoke(tmp_path / "missing")
    assert result.exit_code == 2 and "NEMO_GYM_EPISODE_DIR" in result.output


# ----------------------------------------------------------------------------- environments


@pytest.fixture
def env_store(tmp_path: Path) -> Path:
    return build_env_store(tmp_path / "envs")


def _rows(text: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in text.strip().splitlines()]


def test_the_store_reads_each_episodes_environment_and_verdict(env_store: Path) -> None:
    episodes = {e.episode_id: e for e in load(env_store).episodes}
    assert {i: (e.environment, e.kind) for i, e in episodes.items() if e.role == "train"} == {
        "s1": ("swe", "resolved"), "s2": ("swe", "unresolved"),
        "m1": ("mcqa", "passed"), "m2": ("mcqa", "failed"), "m3": ("mcqa", "passed"),
        "w1": ("workplace_assistant", "failed"),  # partial credit is not a pass
        "w2": ("workplace_assistant", "transport_unreachable"),
        "w3": ("workplace_assistant", "passed"),
    }  # fmt: skip


def test_a_record_without_a_readable_environment_is_swe(tmp_path: Path) -> None:
    write_step(tmp_path / "ep", "train", 1, [
        entry("a", record={"environment": "mcqa"}, reward=1.0), entry("b"),
        entry("c", record={"environment": ["mcqa"]}, reward=1.0), entry("d", record={"environment": ""}),
    ])  # fmt: skip
    store = load(tmp_path / "ep")
    assert [e.environment for e in store.episodes] == ["mcqa", "swe", "swe", "swe"]
    assert [e.kind for e in store.episodes] == ["passed", "resolved", "resolved", "resolved"]
    assert any("record.environment" in str(problem) for problem in store.problems)


def test_the_table_shows_a_pass_rate_and_a_breakdown_per_environment(env_store: Path) -> None:
    result = CliRunner().invoke(app, ["episodes", str(env_store)], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    steps, environments = result.output.split("\n\n")
    assert _rows(steps) == [
        ["role", "step", "episodes", "valid", "pass rate", "mean turns", "mean s", "failures by kind"],
        ["eval", "2", "4", "4", "50.0%", "2.0", "4.0", "-"],
        # s1 resolved and m1 passed of s1, s2, m1, m2, w1 (0.5: not a pass); w2 set aside.
        ["train", "1", "6", "5", "40.0%", "7.2", "4.0", "transport_unreachable 1"],
        ["train", "2", "2", "2", "100.0%", "4.5", "4.0", "-"],
    ]
    assert _rows(environments) == [
        ["role", "environment", "episodes", "valid", "pass rate", "reward", "mean turns", "failures by kind"],
        ["eval", "mcqa", "2", "2", "50.0%", "0.50", "2.0", "-"],
        ["eval", "swe", "2", "2", "50.0%", "0.50", "2.0", "-"],
        ["train", "mcqa", "3", "3", "66.7%", "0.67", "1.7", "-"],
        ["train", "swe", "2", "2", "50.0%", "0.50", "15.0", "-"],
        ["train", "workplace_assistant", "3", "2", "50.0%", "0.75", "5.0", "transport_unreachable 1"],
    ]


def test_env_filters_every_text_view(env_store: Path) -> None:
    only = invoke(env_store, "--env", "mcqa")
    assert only.exit_code == 0 and "\n\n" not in only.output.strip()  # one environment: no breakdown
    assert [row[:5] for row in _rows(only.output)[1:]] == [
        ["eval", "2", "2", "2", "50.0%"], ["train", "1", "2", "2", "50.0%"], ["train", "2", "1", "1", "100.0%"]
    ]  # fmt: skip
    swe = invoke(env_store, "--env", "swe")
    assert _rows(swe.output)[0][4] == "resolve rate"  # SWE alone: today's table
    both = invoke(env_store, "--env", "swe", "--env", "workplace_assistant", "--step", "1")
    assert _listed(both.output) == ["s1", "s2", "w1", "w2"]
    assert _listed(invoke(env_store, "--kind", "failed", "--env", "mcqa").output) == ["e2", "m2"]
    assert invoke(env_store, "--env", "mcqa", "--show", "s1").exit_code == 2  # not an mcqa episode
    assert invoke(env_store, "--env", "swe", "--show", "s1").exit_code == 0
    none = CliRunner().invoke(app, ["episodes", str(env_store), "--env", "nope", "--step", "1"])
    assert none.exit_code == 0 and none.stdout == ""
    assert none.stderr == f"no episodes match --step 1 --env nope (of 12 in {env_store})\n"


def test_show_names_the_environment_and_the_verify_answer(env_store: Path) -> None:
    out = invoke(env_store, "--show", "m1").output
    assert out.startswith("episode m1   instance mcqa/m1\nenvironment mcqa   train   step 1   session s-m1\n")
    assert "verdict: passed   reward 1.0" in out
    assert "--- turn 1\nthought:\n\\boxed{m1}" in out
    assert out.endswith('--- verify\nreward: 1.0\nextracted_answer: "B"\n')
    assert "--- patch" not in out and "test report" not in out and "responses_create_params" not in out
    assert "(no verify answer: nothing came back)" in invoke(env_store, "--show", "w2").output


def test_html_and_plots_follow_env(env_store: Path, tmp_path: Path) -> None:
    page = tmp_path / "all.html"
    assert invoke(env_store, "--html", page).exit_code == 0
    text = page.read_text()
    assert text.count("<details>") == 12 and "<h2>Per environment</h2>" in text
    assert "<td>workplace_assistant</td>" in text and "pass rate (valid episodes) per step" in text
    assert invoke(env_store, "--html", page, "--env", "mcqa").exit_code == 0
    text = page.read_text()
    assert text.count("<details>") == 5 and "Per environment" not in text and "workplace_assistant" not in text

    plots = tmp_path / "plots"
    assert invoke(env_store, "--plots", plots).exit_code == 0
    assert (plots / "train-reward-per-environment.svg").is_file()
    only = tmp_path / "only"
    assert invoke(env_store, "--plots", only, "--env", "mcqa").exit_code == 0
    assert sorted(p.name for p in only.iterdir()) == [
        "eval-mixed-pass-at-k.svg", "train-episode-time.svg", "train-failure-rate.svg", "train-reward-resolve-rate.svg"
    ]  # fmt: skip


# ----------------------------------------------------------------------------- --show's head, --list


def _at_80(*args: str | Path) -> Any:
    result = CliRunner().invoke(app, ["episodes", *map(str, args)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result


def test_show_labels_what_each_count_counts(tmp_path: Path) -> None:
    """0 turns and 0 tool calls beside 3 policy calls: each says what it counts, so they do not contradict."""
    out = _at_80(build_failed_store(tmp_path / "ep"), "--show", FAILED_IDS["crash"]).stdout
    assert "in the trajectory the server returned: 0 turns, 0 tool calls\n" in out
    assert "requests the policy answered (counted by the run, not the server): 3\n" in out
    assert "turns 0   tool calls 0" not in out and "policy calls answered" not in out


def test_show_cuts_the_servers_error_to_its_last_lines_and_says_where_it_is(tmp_path: Path) -> None:
    store = build_failed_store(tmp_path / "ep")
    out = _at_80(store, "--show", FAILED_IDS["crash"]).stdout
    shown = [line for line in out.splitlines() if "ray/_private/worker.py" in line]
    assert len(shown) == 7 and "line 87, in" in shown[-1]  # the last 8 lines: 7 frames and the error
    assert "line 80, in" not in out
    assert "ray.exceptions.RayTaskError(RuntimeError): sandbox died" in out
    files = sorted((store / "train").glob("step-000001-*.jsonl.gz"))
    assert len(files) == 1
    assert f"last 8 of 90 lines (whole: answer.metadata.error on line 2 of {files[0]}, or in the --html page):\n" in out
    assert "expected without network" not in out  # not smoke's no-network failure


def test_show_notes_smokes_expected_no_network_failure(tmp_path: Path) -> None:
    out = _at_80(build_failed_store(tmp_path / "ep"), "--show", FAILED_IDS["offline"]).stdout
    assert f"\nnote: {OFFLINE_REASON}\n" in out and "last 8 of 90 lines" in out


def test_show_header_fits_80_columns(tmp_path: Path) -> None:
    from tests.test_widths import fits

    build_failed_store(tmp_path / "ep")
    for episode_id in FAILED_IDS.values():
        out = _at_80(tmp_path / "ep", "--show", episode_id).stdout
        head = out.split("\nset aside, not trained on", 1)[0]  # then free text: whole lines, wrapped on a terminal
        assert len(fits(head, 80)) == 6
        assert head.startswith(f"episode {episode_id}   instance ")


def test_list_prints_every_episode_id_with_its_step_and_verdict(wheel_store: Path, tmp_path: Path) -> None:
    from tests.test_widths import fits

    out = _at_80(wheel_store, "--list").stdout
    lines = fits(out, 80)
    assert lines[0].split() == ["episode", "role", "step", "verdict"]
    everything = [e.episode_id for e in load(wheel_store).episodes]
    assert [line.split()[0] for line in lines[1:]] == everything
    assert lines[-2].split() == ["crash0", "train", "1", "agent_run_error"]
    assert lines[-1].split() == ["late0", "train", "pending", "unresolved"]
    failed = fits(_at_80(build_failed_store(tmp_path / "failed"), "--list").stdout, 80)
    assert failed[1].split() == [FAILED_IDS["offline"], "train", "1", "agent_run_error"]
    assert [line.split()[0] for line in _at_80(wheel_store, "--list", "--step", "1").stdout.splitlines()[1:]] == [
        e.episode_id for e in load(wheel_store).episodes if e.step == 1
    ]


def test_one_name_for_one_rate_in_the_text_table_the_page_and_its_plots(env_store: Path, tmp_path: Path) -> None:
    """A mixed store's rate over every valid episode is its "pass rate" everywhere; the plot's
    series over SWE-bench episodes alone is another quantity, so another name."""
    text = CliRunner().invoke(app, ["episodes", str(env_store)], env={"COLUMNS": "120"}).output
    steps, environments = text.split("\n\n")
    assert _rows(steps)[0][4] == "pass rate" and _rows(environments)[0][4] == "pass rate"
    page = tmp_path / "mixed.html"
    assert invoke(env_store, "--html", page).exit_code == 0
    html = page.read_text()
    assert html.count("<th>pass rate</th>") == 2 and "train: pass rate (valid episodes) per step" in html
    assert "SWE resolve rate" in html  # the plot's series and the note saying what it covers
    assert "resolve rate (0-1)" not in html
    assert ">resolve rate" not in html.replace(">SWE resolve rate", "")  # no bare "resolve rate" label
    # SWE alone: the table's rate is the plot's, and both say "resolve rate".
    swe_page = tmp_path / "swe.html"
    assert invoke(env_store, "--html", swe_page, "--env", "swe").exit_code == 0
    swe = swe_page.read_text()
    assert "<th>resolve rate</th>" in swe and "resolve rate: latest" in swe and "SWE resolve rate" not in swe
    assert _rows(invoke(env_store, "--env", "swe").output)[0][4] == "resolve rate"
