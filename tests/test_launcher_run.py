"""``examples/swebench_grpo/run.py``: --dry-run and the orchestration order.

The side effects (conversion, Ray, job submission) need GPUs and Ray; here they are
replaced by a recorder that implements the launcher's ``Actions`` interface, so what is
tested is the order and the conditions: nothing starts before preflight passed, the
conversion runs only when its target is missing, a Ray head is started only when none
answers and is stopped afterwards, the job's exit code is the launcher's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from miles_nemogym.checks import CheckResult, Status
from miles_nemogym.launcher import _command as cmd
from miles_nemogym.launcher import run
from miles_nemogym.launcher._config import LauncherConfig
from miles_nemogym.launcher._families import resolve
from miles_nemogym.settings import Settings
from tests.support.launcher_script import run_launcher
from tests.support.miles_checkout import MODEL_ARGS, make_miles_checkout


class Recorder:
    """Records what the launcher asks for; the Ray dashboard 'answers' per ``ray_up``."""

    def __init__(self, *, ray_up: bool = True, job_exit: int = 0, convert_exit: int = 0) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.ray_up = ray_up
        self.job_exit = job_exit
        self.convert_exit = convert_exit
        self.job: cmd.Job | None = None

    def convert_checkpoint(self, argv: list[str], env: Mapping[str, str]) -> int:
        self.calls.append(("convert", argv))
        return self.convert_exit

    def ray_reachable(self, address: str) -> bool:
        self.calls.append(("ray_reachable", address))
        return self.ray_up

    def start_ray_head(self, config: LauncherConfig) -> None:
        self.calls.append(("start_ray_head", config.gpus_per_node))
        self.ray_up = True

    def ray_head_exit(self) -> int | None:
        return None

    def stop_ray_head(self) -> None:
        self.calls.append(("stop_ray_head", None))

    def submit(self, job: cmd.Job, address: str, submission_id: str) -> int:
        self.calls.append(("submit", address))
        self.job = job
        return self.job_exit

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


class Refuses(Recorder):
    def convert_checkpoint(self, argv: list[str], env: Mapping[str, str]) -> int:
        raise AssertionError("a dry run must not convert")

    def ray_reachable(self, address: str) -> bool:
        raise AssertionError("a dry run must not touch Ray")

    def start_ray_head(self, config: LauncherConfig) -> None:
        raise AssertionError("a dry run must not start Ray")

    def submit(self, job: cmd.Job, address: str, submission_id: str) -> int:
        raise AssertionError("a dry run must not submit")


def passing(*_: Any, **__: Any) -> list[CheckResult]:
    return [CheckResult("stand-in", Status.passed, "ok")]


def failing(*_: Any, **__: Any) -> list[CheckResult]:
    return [CheckResult("stand-in", Status.failed, "broken", "repair it")]


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/support/clean_env.py


def execute(tmp_path: Path, actions: Recorder, *, checks: Any = passing, **fields: Any) -> tuple[int, LauncherConfig]:
    config = LauncherConfig(base_dir=tmp_path, **fields)
    parsers = resolve(config.hf_checkpoint)
    miles = make_miles_checkout(tmp_path / "miles")
    code = run.execute(config, parsers, dry_run=False, environ={}, actions=actions, checks=checks, miles_root=miles)
    return code, config


# --- dry run -----------------------------------------------------------------------------


def test_dry_run_prints_command_and_env_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    miles = make_miles_checkout(tmp_path / "miles")
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", "sk-never-shown")
    code = run.main(
        ["--dry-run", "--miles-root", str(miles), "--num-rollout", "100", "--nemo-gym-url", "http://gym:12000"],
        actions=Refuses(),
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "sk-never-shown" not in out
    assert "NEMO_GYM_POLICY_API_KEY='<hidden>'" in out
    assert "MILES_EXPERIMENTAL_ROLLOUT_REFACTOR=1" in out
    assert "NEMO_GYM_URL=http://gym:12000" in out
    assert f"python3 {miles}/train.py" in out
    assert "--num-rollout 100" in out
    assert " ".join(MODEL_ARGS[:2]) in out  # the model script's arguments, loaded from the checkout
    assert "--custom-agent-function-path miles_nemogym.agent.run" in out
    assert "convert_hf_to_torch_dist.py" in out  # the conversion that would run
    assert not list(tmp_path.glob("*_torch_dist"))


def test_dry_run_shows_the_eval_and_episode_store_wiring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    miles = make_miles_checkout(tmp_path / "miles")
    argv = ["--dry-run", "--miles-root", str(miles), "--save-dir", "/runs/r1", "--eval-data", "/data/holdout.jsonl",
            "--eval-name", "verified", "--eval-interval", "10", "--eval-samples-per-prompt", "8",
            "--eval-temperature", "0.6"]  # fmt: skip
    assert run.main(argv, actions=Refuses()) == 0
    out = capsys.readouterr().out
    assert "NEMO_GYM_EPISODE_DIR=/runs/r1/episodes" in out
    assert "episode store: /runs/r1/episodes (browse: miles-nemogym episodes /runs/r1/episodes)" in notes_text(out)
    for line in ("--eval-prompt-data verified /data/holdout.jsonl", "--eval-interval 10",
                 "--n-samples-per-eval-prompt 8", "--eval-temperature 0.6", "--log-passrate",
                 "--custom-eval-rollout-log-function-path miles_nemogym.metrics.log_eval"):  # fmt: skip
        assert line in out
    assert '"metadata_overrides": {"nemogym_eval_set": "verified", "nemogym_role": "eval"}' in out
    assert run.main(["--dry-run", "--miles-root", str(miles), "--no-store-episodes"], actions=Refuses()) == 0
    assert "# episode store: off" in capsys.readouterr().out


def test_dry_run_shows_each_environment_and_the_nemo_gym_envs_the_job_gets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    miles = make_miles_checkout(tmp_path / "miles")
    monkeypatch.setenv("NEMO_GYM_ENVS", '{"stale": "http://old-gym:1"}')  # the shell's: the recipe's replaces it
    argv = ["--miles-root", str(miles), "--nemo-gym-env", "mcqa=http://trainer:pw-321@gym:8001",
            "--nemo-gym-env", "workplace_assistant=http://gym:8002,max_steps=6", "--tools-not-served", "mcqa",
            "--eval-data", "mcqa=/data/mcqa.jsonl", "--eval-data", "workplace_assistant=/data/wa.jsonl"]  # fmt: skip
    assert run.main(["--dry-run", *argv], actions=Refuses()) == 0
    out = capsys.readouterr().out
    assert "pw-321" not in out and "stale" not in out
    wanted = (
        '{"mcqa": "http://trainer:***@gym:8001", "workplace_assistant": {"url": "http://gym:8002", "max_steps": 6}}'
    )
    assert f"NEMO_GYM_ENVS='{wanted}'" in out.splitlines()
    assert (
        "# environments (from --nemo-gym-env; the job's NEMO_GYM_ENVS above):\n"
        "#   mcqa: http://trainer:***@gym:8001 (no max_steps, tools not served)\n"
        "#   workplace_assistant: http://gym:8002 (max_steps 6)\n"
    ) in out
    assert "--eval-prompt-data mcqa /data/mcqa.jsonl workplace_assistant /data/wa.jsonl" in out
    for name in ("mcqa", "workplace_assistant"):
        assert f'"metadata_overrides": {{"nemogym_eval_set": "{name}", "nemogym_role": "eval"}}' in out
    # The job gets the real URLs, in the form the agent function's settings read back.
    config, parsers, _ = run.load(argv)
    job = cmd.build_job(config, parsers, cmd.MilesInstall(miles, MODEL_ARGS), {"NEMO_GYM_ENVS": "{}"})
    assert Settings.from_env(job.env).environments == config.nemo_gym_envs
    assert config.nemo_gym_envs["mcqa"].url == "http://trainer:pw-321@gym:8001"


def test_dry_run_without_environments_says_so_and_the_job_gets_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    miles = make_miles_checkout(tmp_path / "miles")
    monkeypatch.setenv("COLUMNS", "80")
    assert run.main(["--dry-run", "--miles-root", str(miles)], actions=Refuses()) == 0
    out = capsys.readouterr().out
    assert "# environments: none (NEMO_GYM_ENVS unset): rows run through the server above" in out
    assert "NEMO_GYM_ENVS=" not in out
    # A recipe that clears them keeps the shell's NEMO_GYM_ENVS from reaching the job.
    monkeypatch.setenv("NEMO_GYM_ENVS", '{"mcqa": "http://gym:8001"}')
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("nemo_gym_envs: {}\n")
    assert run.main(["--dry-run", "--miles-root", str(miles), "--config", str(recipe)], actions=Refuses()) == 0
    out = capsys.readouterr().out
    assert "NEMO_GYM_ENVS=" not in out
    assert (
        "# environments: none (nemo_gym_envs in the --config recipe): rows run through\n#     the server above\n"
    ) in out  # wrapped to the terminal's 80 columns, as a comment still


def test_dry_run_hides_url_passwords_but_the_job_gets_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    miles = make_miles_checkout(tmp_path / "miles")
    monkeypatch.setenv("NEMO_GYM_URL", "http://trainer:gym-pass-123@gym:12000")
    monkeypatch.setenv("RAY_ADDRESS", "http://ray:ray-pass-456@head:8265")
    code = run.main(["--dry-run", "--miles-root", str(miles)], actions=Refuses())
    out = capsys.readouterr().out
    assert code == 0
    assert "gym-pass-123" not in out and "ray-pass-456" not in out
    assert "NEMO_GYM_URL='http://trainer:***@gym:12000'" in out
    assert "# Ray job submission address: http://ray:***@head:8265" in out
    config, parsers, _ = run.load(["--miles-root", str(miles)])
    job = cmd.build_job(config, parsers, cmd.MilesInstall(miles, MODEL_ARGS), {})
    assert job.env["NEMO_GYM_URL"] == "http://trainer:gym-pass-123@gym:12000"


def test_dry_run_says_which_gym_url_it_uses_and_where_it_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    miles = make_miles_checkout(tmp_path / "miles")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("nemo_gym_url: http://from-recipe:12000\n")

    def origin_line(*argv: str) -> str:
        assert run.main(["--dry-run", "--miles-root", str(miles), *argv], actions=Refuses()) == 0
        (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# NeMo-Gym server:")]
        return line

    assert origin_line() == "# NeMo-Gym server: http://localhost:12000 (from the default)"
    monkeypatch.setenv("NEMO_GYM_URL", "http://user:pw-789@from-env:12000")
    assert origin_line() == "# NeMo-Gym server: http://user:***@from-env:12000 (from NEMO_GYM_URL in the environment)"
    assert origin_line("--config", str(recipe)) == (
        "# NeMo-Gym server: http://from-recipe:12000 (from nemo_gym_url in the --config recipe)"
    )
    assert origin_line("--config", str(recipe), "--nemo-gym-url", "http://flag:1") == (
        "# NeMo-Gym server: http://flag:1 (from --nemo-gym-url)"
    )


def test_relative_paths_reach_the_job_resolved_and_it_runs_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    miles = make_miles_checkout(tmp_path / "miles")
    here = tmp_path / "launched from"
    here.mkdir()
    monkeypatch.chdir(here)
    argv = ["--dry-run", "--miles-root", str(miles), "--prompt-data", "train.jsonl", "--episode-dir", "eps"]
    assert run.main(argv, actions=Refuses()) == 0
    out = capsys.readouterr().out
    assert f"NEMO_GYM_EPISODE_DIR='{here}/eps'" in out
    assert f"--prompt-data '{here}/train.jsonl'" in out
    assert f"\ncd '{here}'\npython3 {miles}/train.py" in out
    actions = Recorder()
    execute(tmp_path / "run", actions, skip_prepare=True)
    assert actions.job is not None and actions.job.cwd == here


def test_dry_run_without_miles_shows_placeholders(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = run.main(["--dry-run", "--miles-root", str(tmp_path / "absent")], actions=Refuses())
    captured = capsys.readouterr()
    assert code == 0
    assert "<arguments of scripts/models/qwen3-4B-Instruct-2507.py>" in captured.out
    assert "Miles not usable here" in captured.out


def notes_text(out: str) -> str:
    """The dry run's ``#`` notes as one line: wrapped notes read whole."""
    return " ".join(" ".join(line.removeprefix("#").split()) for line in out.splitlines() if line.startswith("#"))


def test_dry_run_points_to_preflight_and_its_notes_fit_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    store = "/runs/qwen3-4b-grpo-first-try/episodes"
    argv = ["--dry-run", "--miles-root", "/nonexistent/miles", "--episode-dir", store]
    assert run.main(argv, actions=Refuses()) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("#") and len(line) > 80] == []
    said = notes_text(out)
    assert "Miles not usable here (" in said and "its checkout and model arguments are placeholders" in said
    assert f"episode store: {store} (browse: miles-nemogym episodes {store})" in said
    assert "the same command with --preflight-only instead of --dry-run checks this machine" in said


def test_example_script_runs_as_a_file() -> None:
    done = run_launcher("--dry-run", "--model", "zai-org/GLM-4.7-Flash", "--skip-prepare")
    assert done.returncode == 0, done.stderr
    assert "--tito-model glm47" in done.stdout
    assert "--sglang-tool-call-parser glm47" in done.stdout
    assert "convert_hf_to_torch_dist" not in done.stdout


def test_bad_recipe_exits_2_with_the_field_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--dry-run", "--eps-clip", "-1"], actions=Refuses()) == 2
    assert "--eps-clip" in capsys.readouterr().err


def test_unreadable_config_and_unbalanced_extra_args_exit_2_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes("num_rollout: 5\n".encode("utf-16"))
    assert run.main(["--dry-run", "--config", str(recipe)], actions=Refuses()) == 2
    assert capsys.readouterr().err == (
        f"error: --config {recipe}: not UTF-8 text (a binary file, or saved as UTF-16?); "
        "save the recipe as UTF-8 YAML\n"
    )
    assert run.main(["--dry-run", "--extra-args", '--wandb-group "x'], actions=Refuses()) == 2
    err = capsys.readouterr().err
    assert "cannot split it as shell words (No closing quotation)" in err
    assert "Traceback" not in err


def test_duplicate_extra_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--dry-run", "--extra-args", "--lr 1"], actions=Refuses()) == 2
    assert "--lr" in capsys.readouterr().err


# --- orchestration -----------------------------------------------------------------------


def test_failed_preflight_starts_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    actions = Recorder()
    code, _ = execute(tmp_path, actions, checks=failing)
    assert code == 2
    assert actions.calls == []
    out = capsys.readouterr().out
    assert "broken" in out and "repair it" in out


def test_converts_then_starts_ray_then_submits_then_stops_ray(tmp_path: Path) -> None:
    actions = Recorder(ray_up=False, job_exit=0)
    code, config = execute(tmp_path, actions)
    assert code == 0
    assert actions.names() == [
        "convert",
        "ray_reachable",
        "start_ray_head",
        "ray_reachable",
        "submit",
        "stop_ray_head",
    ]
    convert_argv = actions.calls[0][1]
    assert convert_argv[-2:] == ["--save", str(config.resolved_ref_load)]
    assert actions.job is not None and actions.job.env["MILES_EXPERIMENTAL_ROLLOUT_REFACTOR"] == "1"


def test_existing_checkpoint_and_cluster_are_reused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "Qwen3-4B-Instruct-2507_torch_dist"
    target.mkdir()
    (target / "latest_checkpointed_iteration.txt").write_text("release")
    actions = Recorder(ray_up=True, job_exit=1)
    code, _ = execute(tmp_path, actions)
    assert code == 1  # the job's result
    assert actions.names() == ["ray_reachable", "submit"]
    assert "a Ray cluster already answers at http://127.0.0.1:8265" in capsys.readouterr().out


def test_skip_prepare_skips_conversion(tmp_path: Path) -> None:
    actions = Recorder()
    execute(tmp_path, actions, skip_prepare=True)
    assert "convert" not in actions.names()


def test_failed_conversion_stops_before_ray(tmp_path: Path) -> None:
    actions = Recorder(convert_exit=3)
    code, _ = execute(tmp_path, actions)
    assert code == 1
    assert actions.names() == ["convert"]


def test_given_ray_address_that_does_not_answer_is_an_error(tmp_path: Path) -> None:
    actions = Recorder(ray_up=False)
    code, _ = execute(tmp_path, actions, skip_prepare=True, ray_address="http://head:8265")
    assert code == 2
    assert actions.names() == ["ray_reachable"]
    assert actions.calls[0][1] == "http://head:8265"


def test_a_ray_address_without_a_scheme_is_http_as_ray_reads_it(tmp_path: Path) -> None:
    # The launcher asked "head:8265/api/version", which no opener can: a running cluster was "not answering".
    actions = Recorder(ray_up=True)
    execute(tmp_path, actions, skip_prepare=True, ray_address="head:8265")
    assert actions.calls == [("ray_reachable", "http://head:8265"), ("submit", "http://head:8265")]


@pytest.mark.parametrize("address", ["auto", "ray://head:10001", "ray://alice:s3cretpw@head:10001"])
def test_a_ray_address_that_is_not_a_dashboards_is_refused_with_the_fix(address: str) -> None:
    with pytest.raises(ValidationError, match="give the Ray dashboard's, as in http://HEAD:8265") as refused:
        LauncherConfig(ray_address=address)
    assert "s3cretpw" not in refused.value.errors()[0]["msg"]  # what the launcher prints: no password


class DyingHead(Recorder):
    """A head whose process exits before its dashboard answers (a port taken, say)."""

    def start_ray_head(self, config: LauncherConfig) -> None:
        self.calls.append(("start_ray_head", config.gpus_per_node))

    def ray_head_exit(self) -> int | None:
        return 1


def test_a_head_that_exits_fails_the_launch_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    actions = DyingHead(ray_up=False)
    code, _ = execute(tmp_path, actions, skip_prepare=True)
    assert code == 1
    assert actions.names() == ["ray_reachable", "start_ray_head", "ray_reachable", "stop_ray_head"]
    err = capsys.readouterr().err
    assert "error: the Ray head exited with code 1 but http://127.0.0.1:8265 does not answer" in err
    assert "session_latest/logs" in err


def test_keep_ray_leaves_the_head_running(tmp_path: Path) -> None:
    actions = Recorder(ray_up=False)
    execute(tmp_path, actions, skip_prepare=True, keep_ray=True)
    assert "start_ray_head" in actions.names()
    assert "stop_ray_head" not in actions.names()


def test_unloadable_model_arguments_stop_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = LauncherConfig(base_dir=tmp_path, megatron_model_type="no-such-model")
    miles = make_miles_checkout(tmp_path / "miles")
    actions = Recorder()
    code = run.execute(
        config,
        resolve(config.hf_checkpoint),
        dry_run=False,
        environ={},
        actions=actions,
        checks=passing,
        miles_root=miles,
    )
    assert code == 2
    assert actions.calls == []
    assert "no-such-model" in capsys.readouterr().err


def test_preflight_only_stops_after_the_checks(tmp_path: Path) -> None:
    actions = Recorder()
    code, _ = execute(tmp_path, actions, preflight_only=True)
    assert code == 0
    assert actions.calls == []
    code, _ = execute(tmp_path / "second", actions, checks=failing, preflight_only=True)
    assert code == 2
