"""NeMo-Gym benchmarks by name: ``convert --env BENCHMARK[=FILE]`` through ``agent.run`` and
Miles' eval step, graded by the real 0.7.0 resources server.

``aime25`` and ``gsm8k`` from prepared files written here (``{"question", "expected_answer"}``,
what their ``gym eval prepare`` writes), ``aegis_v4_safety`` from the data the wheel ships. The
prompt config is applied by nemo-gym (``materialize_prompts`` in the server venv); each row's
question carries the tag of the scripted answer (``tests/support/scripted_chat.py``), which the
benchmark's template keeps at the end of the user message. The ``math_with_judge`` server is the
one the suite already starts (``gym_environments``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from miles_nemogym import agent
from miles_nemogym.cli.main import app
from miles_nemogym.episode.record import TASK_ID_KEY
from miles_nemogym.launcher._command import eval_args, eval_config_document
from miles_nemogym.launcher._config import LauncherConfig
from tests.support.env_scripts import BENCHMARKS
from tests.support.fault_server import FaultServer
from tests.support.gym_envs import GymEnvironments
from tests.support.miles_environments import completion
from tests.support.miles_harness import MilesDriver
from tests.support.scripted_chat import ScriptedChat, Turn, tag
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.integration

GRADER = "math_with_judge"
KWARGS = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 512}


def _prepared(folder: Path, name: str, rows: list[tuple[str, str]]) -> Path:
    """A prepared file as the benchmark's ``prepare.py`` writes it: question and answer, no prompt."""
    path = folder / f"{name}_prepared.jsonl"
    path.write_text("".join(json.dumps({"question": q, "expected_answer": a}) + "\n" for q, a in rows))
    return path


def _convert(tmp_path: Path, spec: str) -> list[dict[str, Any]]:
    out = tmp_path / f"{spec.split('=')[0]}.jsonl"
    done = CliRunner().invoke(app, ["convert", "--env", spec, "-o", str(out), "-q"])
    assert done.exit_code == 0, done.output
    said = " ".join(done.output.split())
    assert f"benchmark {spec.split('=')[0]} (the rows of" in said and "applied by nemo-gym): graded by" in said
    return [json.loads(line) for line in out.read_text().splitlines()]


def _template(envs: GymEnvironments, prompt_config: str) -> str:
    """The first line of the benchmark's own prompt template, as the wheel ships it."""
    text = yaml.safe_load((envs.venv.site_packages / prompt_config).read_text())["user"]
    return str(text).split("\n")[0]


@pytest.mark.parametrize(("benchmark", "repeats"), list(zip(BENCHMARKS, (32, 1), strict=True)))
async def test_a_prepared_benchmark_converts_with_its_prompt_and_grades_through_agent_run(
    gym_environments: GymEnvironments,
    gym_chat: ScriptedChat,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    benchmark: str,
    repeats: int,
) -> None:
    gold, wrong = f"{benchmark}_gold", f"{benchmark}_wrong"
    source = _prepared(tmp_path, benchmark, [(f"How many? {tag(gold)}", "42"), (f"How many? {tag(wrong)}", "42")])
    rows = _convert(tmp_path, f"{benchmark}={source}")

    assert len(rows) == 2
    user = rows[0]["prompt"][-1]["content"]
    assert user.startswith(_template(gym_environments, "benchmarks/prompts/generic/math.yaml").split("\\boxed")[0])
    assert "inside \\boxed{}." in user  # the template's {{}} as str.format renders it
    assert user.endswith(f"How many? {tag(gold)}")
    mark = rows[0]["metadata"]["nemogym_benchmark"]
    assert mark == {
        "name": benchmark,
        "environment": GRADER,
        "num_repeats": repeats,
        "reward_range": [0.0, 1.0],
        "higher_is_better": True,
    }
    assert rows[0]["metadata"]["nemogym_env"] == GRADER

    monkeypatch.setenv("NEMO_GYM_ENVS", json.dumps({GRADER: {"url": gym_environments.resources_url(GRADER)}}))
    gym_chat.script(gold, Turn(content="There are \\boxed{42} of them."))
    gym_chat.script(wrong, Turn(content="\\boxed{41}"))
    for row, name, reward in ((rows[0], gold, 1.0), (rows[1], wrong, 0.0)):
        out = await agent.run(
            base_url=gym_chat.session_url(name), prompt=row["prompt"], request_kwargs=KWARGS, metadata=row["metadata"]
        )
        assert out["nemogym"]["status"] == "ok", out["nemogym"]
        assert out["reward"] == reward, out["eval_report"]


def test_a_benchmark_whose_data_ships_converts_by_its_name_alone(tmp_path: Path) -> None:
    rows = _convert(tmp_path, "aegis_v4_safety")
    assert len(rows) == 5  # the five rows nemo-gym ships
    first = rows[0]
    assert first["prompt"] == [{"role": "user", "content": first["metadata"]["prompt"]}]  # its template: {prompt}
    assert first["metadata"]["nemogym_benchmark"]["environment"] == "aegis_v4_safety"
    assert first["metadata"]["nemogym_env"] == "aegis_v4_safety"


def test_an_unknown_benchmark_gets_the_closest_catalog_names(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["convert", "--env", "aime2", "-o", str(tmp_path / "x.jsonl")])
    assert done.exit_code == 2
    assert "did you mean aime26, aime25" in " ".join(done.output.split())
    assert not (tmp_path / "x.jsonl").exists()


def test_miles_eval_step_samples_a_benchmark_its_repeats_and_logs_pass_at_k(
    miles_driver: MilesDriver,
    gym_environments: GymEnvironments,
    results: dict[str, dict[str, Any]],
    tmp_path: Path,
) -> None:
    # One aime25 task played by a gold and a wrong row (the engine answers a prompt's samples
    # alike): 2 x 32 episodes, half passing.
    source = _prepared(tmp_path, "aime25", [(f"Count. {tag('b_gold')}", "7"), (f"Count. {tag('b_wrong')}", "7")])
    rows = _convert(tmp_path, f"aime25={source}")
    for row in rows:
        row["metadata"][TASK_ID_KEY] = "aime25/task"
    data = tmp_path / "aime25_eval.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = LauncherConfig(eval_data=[f"aime25={data}"], eval_samples_per_prompt=2, eval_interval=1)
    [dataset] = eval_config_document(config)["eval"]["datasets"]
    assert dataset["n_samples_per_eval_prompt"] == 32  # the benchmark's num_repeats, not the flag's 2
    texts = {"b_gold": [completion(Turn(content="\\boxed{7}"))], "b_wrong": [completion(Turn(content="\\boxed{8}"))]}
    setting = {GRADER: {"url": gym_environments.resources_url(GRADER)}}
    swe = FaultServer(result=next(iter(results.values())))
    with serving_in_thread(swe):
        result = miles_driver.step(
            gym_url=swe.url,
            data_file=data,
            n_samples=2,
            mode="eval",
            env={"NEMO_GYM_ENVS": json.dumps(setting), "NEMO_GYM_RUN_TIMEOUT": "600"},
            extra_argv=eval_args(config),
            scripts=texts,
            rollout_id=3,
            time_limit_s=420,
        ).check()

    samples = result.eval["aime25"]["samples"]
    assert len(samples) == 64
    tracked = result.tracked("eval/step")
    prefix = "nemogym-eval/aime25/"
    assert tracked[prefix + "episodes_valid"] == 64.0 and tracked[prefix + "instances"] == 1.0
    assert tracked[prefix + "reward_mean"] == 0.5 and tracked[prefix + "pass@1"] == 0.5
    # pass@k of 32 passes among 64: 1 - C(32, k) / C(64, k), k = 2, 4, ..., 32.
    from math import comb

    for k in (2, 4, 8, 16, 32):
        assert tracked[prefix + f"pass@{k}"] == pytest.approx(1 - comb(32, k) / comb(64, k)), k
    assert prefix + "pass@64" not in tracked
