"""The launcher's recipe: defaults, YAML + CLI precedence, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_nemogym.launcher._config import ConfigError, LauncherConfig, load_config, read_yaml
from miles_nemogym.launcher.run import load, main, parse_cli
from miles_nemogym.settings import EnvironmentServer

EXAMPLE_RECIPE = Path(__file__).resolve().parents[1] / "examples" / "swebench_grpo" / "recipe.yaml"


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/support/clean_env.py


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def test_defaults_are_the_smoke_scale() -> None:
    config = LauncherConfig()
    assert config.hf_checkpoint == "Qwen/Qwen3-4B-Instruct-2507"
    assert (config.gpus_per_node, config.tensor_parallel, config.colocate) == (4, 2, True)
    assert (config.kl_loss_coef, config.eps_clip, config.eps_clip_high) == (0.01, 0.2, 0.28)
    assert (config.max_seq_len, config.rollout_max_response_len) == (16384, 4096)
    assert (config.num_rollout, config.rollout_batch_size, config.n_samples_per_prompt) == (3, 2, 4)
    assert config.resolved_global_batch_size == 8
    assert config.nemo_gym_url == "http://localhost:12000"
    assert config.resolved_ref_load == Path("/root/Qwen3-4B-Instruct-2507_torch_dist")


def test_environment_supplies_gym_url_external_host_and_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", "http://gym-host:12000/")
    monkeypatch.setenv("MILES_ROUTER_EXTERNAL_HOST", "10.0.0.3")
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    config = LauncherConfig()
    assert config.nemo_gym_url == "http://gym-host:12000"
    assert config.router_external_host == "10.0.0.3"
    assert config.ray_address == "http://head:8265"


def test_cli_beats_yaml_beats_env_beats_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", "http://from-env:1")
    recipe = write(
        tmp_path,
        "num_rollout: 50\nlr: 3.0e-6\nnemo-gym-url: http://from-yaml:2\ncolocate: true\nrollout_temperature: 0.6\n",
    )
    argv = ["--config", str(recipe), "--num-rollout", "100", "--no-colocate"]
    config, parsers, dry_run = load([*argv, "--rollout-num-gpus", "2", "--actor-gpus-per-node", "2"])
    assert config.num_rollout == 100  # CLI over YAML
    assert config.lr == 3.0e-6  # YAML over default
    assert config.nemo_gym_url == "http://from-yaml:2"  # YAML over environment
    assert config.colocate is False  # CLI switch over YAML
    assert config.rollout_temperature == 0.6
    assert config.kl_loss_coef == 0.01  # default
    assert parsers.tito_model == "qwen3"
    assert dry_run is False


def test_model_alias_and_family_detection_from_cli() -> None:
    config, parsers, _ = load(["--model", "zai-org/GLM-4.7-Flash", "--megatron-model-type", "glm4.7-flash"])
    assert config.hf_checkpoint == "zai-org/GLM-4.7-Flash"
    assert (parsers.tito_model, parsers.reasoning_parser, parsers.tool_call_parser) == ("glm47", "glm45", "glm47")


def test_unknown_family_is_a_config_error_naming_the_flags() -> None:
    with pytest.raises(ConfigError) as caught:
        load(["--model", "meta-llama/Llama-3.1-8B-Instruct"])
    message = str(caught.value)
    for flag in ("--model-family", "--tito-model", "--reasoning-parser", "--tool-call-parser"):
        assert flag in message


def test_env_and_extra_args_flags() -> None:
    values, config_path, dry_run = parse_cli(
        ["--extra-env", "A=1", "--extra-env", "B=x=y", "--extra-args", "--foo 1", "--extra-args", "--bar 'a b'",
         "--dry-run"]
    )  # fmt: skip
    assert values["extra_env"] == {"A": "1", "B": "x=y"}
    assert values["extra_args"] == ["--foo", "1", "--bar", "a b"]
    assert config_path is None and dry_run is True
    with pytest.raises(ConfigError, match="--extra-env 'novalue': expected NAME=VALUE"):
        parse_cli(["--extra-env", "novalue"])


def test_only_given_flags_override() -> None:
    values, _, _ = parse_cli(["--num-rollout", "7"])
    assert values == {"num_rollout": "7"}


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"num_rollout": 0}, "--num-rollout / recipe key 'num_rollout'"),
        ({"num_rollotu": 5}, "'num_rollotu': unknown setting"),
        ({"mode": "train"}, "--mode"),
        ({"nemo_gym_url": "gym:12000"}, "http(s) URL"),
        ({"nemo_gym_url": "http://gym:12000/run"}, "'/run' is appended"),
        ({"rollout_max_response_len": 20000}, "exceeds max_seq_len"),
        ({"eps_clip_high": 0.1}, "below eps_clip"),
        ({"global_batch_size": 6}, "must divide rollout_batch_size x n_samples_per_prompt (8)"),
        ({"tensor_parallel": 3}, "not a multiple of tensor_parallel"),
        ({"colocate": False}, "set rollout_num_gpus"),
        ({"colocate": False, "rollout_num_gpus": 4}, "cluster has num_nodes x gpus_per_node = 4"),
        ({"colocate": True, "actor_gpus_per_node": 2}, "must equal gpus_per_node when colocate"),
        ({"extra_env": {"MILES_USE_LEGACY_ROLLOUT_V1": "1"}}, "legacy rollout"),
        ({"extra_env": {"NEMO_GYM_ENVS": "{}"}}, "as nemo_gym_envs (--nemo-gym-env NAME=URL), not NEMO_GYM_ENVS"),
        ({"nemo_gym_envs": ["mcqa=gym:8001"]}, "--nemo-gym-envs / recipe key 'nemo_gym_envs': environment 'mcqa': url"),
        ({"nemo_gym_envs": ["swe=http://gym:8001"]}, "'swe' is reserved for NEMO_GYM_URL's /run rows"),
        ({"nemo_gym_envs": ["mcqa=http://gym:8001,max_steps=many"]}, "max_steps must be a whole number"),
        ({"nemo_gym_envs": ["http://gym:8001"]}, "expected NAME=URL or NAME=URL,max_steps=N"),
        ({"nemo_gym_envs": {"mcqa": {"url": "http://gym:8001", "max_steps": 0}}}, "max_steps: Input should be"),
        ({"nemo_gym_envs": "{not json"}, "not JSON; expected a JSON object"),
        ({"tools_not_served": ["x y"]}, "'x y' is not an environment name"),
        ({"eval_data": ["a.jsonl", "b.jsonl"]}, "two files for eval set 'held_out'; name each with NAME=FILE"),
        ({"eval_data": {"a b": "a.jsonl"}}, "eval set name 'a b'"),
        ({"rollout_temperature": float("inf")}, "'rollout_temperature': Input should be a finite number"),
        ({"lr": float("nan")}, "'lr': Input should be a finite number"),
        ({"num_rollout": True}, "'num_rollout': expected a number, got the boolean true"),
        ({"global_batch_size": False}, "'global_batch_size': expected a number, got the boolean false"),
        ({"rollout_top_p": True}, "'rollout_top_p': expected a number, got the boolean true"),
    ],
)
def test_invalid_recipes_name_the_field_and_the_fix(values: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(values, {})  # as --config keys: named as the recipe spells them
    assert fragment in str(caught.value)


def test_a_refusal_names_flags_as_typed_and_recipe_keys_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--dry-run", "--fully-async", "--gpus-per-node", "4"]) == 2
    said = capsys.readouterr().err
    assert "--fully-async generates on GPUs of its own: set --rollout-num-gpus" in said
    assert "e.g. --actor-gpus-per-node 2 and --rollout-num-gpus 2" in said
    assert "rollout_num_gpus" not in said and "actor_gpus_per_node" not in said
    recipe = write(tmp_path, "fully_async: true\nrollout_num_gpus: 2\n")
    assert main(["--dry-run", "--config", str(recipe), "--actor-gpus-per-node", "4"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "x --actor-gpus-per-node = 1 x 4 GPUs and rollout_num_gpus 2 more" in said


def test_global_batch_may_split_a_rollout_into_steps() -> None:
    assert load_config(None, {"global_batch_size": 4}).resolved_global_batch_size == 4


def test_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_yaml(write(tmp_path, "a: [1,\n"))
    with pytest.raises(ConfigError, match="expected a mapping"):
        read_yaml(write(tmp_path, "- 1\n- 2\n"))
    assert read_yaml(write(tmp_path, "")) == {}


def test_yaml_infinity_and_booleans_in_number_fields_are_refused(tmp_path: Path) -> None:
    values = read_yaml(write(tmp_path, "rollout_temperature: .inf\nnum_rollout: true\ncolocate: true\n"))
    with pytest.raises(ConfigError) as caught:
        load_config(values, {})
    message = str(caught.value)
    assert "--rollout-temperature / recipe key 'rollout_temperature': Input should be a finite number" in message
    assert "--num-rollout / recipe key 'num_rollout': expected a number, got the boolean true" in message
    assert "colocate" not in message  # a real boolean setting still takes true


@pytest.mark.parametrize(
    "content",
    [
        "num_rollout: 5\n".encode("utf-16"),  # with its byte-order mark, as Windows editors save it
        bytes(range(256)),
    ],
    ids=["utf-16", "binary"],
)
def test_a_recipe_that_is_not_utf8_text_is_named_with_the_fix(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        read_yaml(path)
    assert str(caught.value) == (
        f"--config {path}: not UTF-8 text (a binary file, or saved as UTF-16?); save the recipe as UTF-8 YAML"
    )


def test_unbalanced_quote_in_extra_args_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_cli(["--extra-args", "--wandb-group 'unclosed"])
    assert str(caught.value).startswith(
        '--extra-args "--wandb-group \'unclosed": cannot split it as shell words (No closing quotation)'
    )
    with pytest.raises(ConfigError, match="--ray-start-args"):
        parse_cli(["--ray-start-args", '--resources "{'])


def test_example_recipe_is_valid_and_matches_the_defaults_it_restates() -> None:
    values = read_yaml(EXAMPLE_RECIPE)
    config = load_config(values, {})
    defaults = LauncherConfig()
    for key in values:
        if key in {"nemo_gym_url", "prompt_data", "num_rollout"}:
            continue  # the example changes these on purpose
        assert getattr(config, key) == getattr(defaults, key), key


def test_environments_from_flags_yaml_json_and_the_caller_s_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mcqa, wa = EnvironmentServer(url="http://gym:8001"), EnvironmentServer(url="http://gym:8002", max_steps=6)
    flags = ["--nemo-gym-env", "mcqa=http://gym:8001/", "--nemo-gym-env", "wa=http://gym:8002,max_steps=6"]
    config, _, _ = load(flags)
    assert config.nemo_gym_envs == {"mcqa": mcqa, "wa": wa}
    assert config.envs_origin == "--nemo-gym-env"
    # What `miles-nemogym serve --env` prints, pasted as one flag.
    pasted, _, _ = load(
        ["--nemo-gym-envs", '{"mcqa": "http://gym:8001", "wa": {"url": "http://gym:8002", "max_steps": 6}}']
    )
    assert pasted.nemo_gym_envs == config.nemo_gym_envs
    recipe = write(tmp_path, "nemo_gym_envs:\n  mcqa: http://gym:8001\n  wa: {url: http://gym:8002, max_steps: 6}\n")
    from_yaml, _, _ = load(["--config", str(recipe)])
    assert from_yaml.nemo_gym_envs == config.nemo_gym_envs
    assert from_yaml.envs_origin == "nemo_gym_envs in the --config recipe"
    assert load([])[0].envs_origin == "NEMO_GYM_ENVS unset"
    monkeypatch.setenv("NEMO_GYM_ENVS", '{"mcqa": "http://env-gym:8001"}')
    from_env, _, _ = load([])
    assert from_env.nemo_gym_envs == {"mcqa": EnvironmentServer(url="http://env-gym:8001")}
    assert from_env.envs_origin == "NEMO_GYM_ENVS in the environment"
    assert load(["--config", str(recipe)])[0].nemo_gym_envs == config.nemo_gym_envs  # the recipe wins
    monkeypatch.setenv("NEMO_GYM_ENVS", "not json")
    with pytest.raises(ConfigError, match="'nemo_gym_envs': not JSON"):
        load([])


def test_eval_sets_one_file_each_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config, _, _ = load(["--eval-data", "mcqa=holdout/mcqa.jsonl", "--eval-data", "swe=/data/swe.jsonl"])
    assert config.eval_data == {"mcqa": tmp_path / "holdout/mcqa.jsonl", "swe": Path("/data/swe.jsonl")}
    # Today's form: one FILE, named by --eval-name; a path with '=' after a '/' is a path.
    config, _, _ = load(["--eval-data", "./a=b.jsonl", "--eval-name", "verified"])
    assert config.eval_data == {"verified": tmp_path / "a=b.jsonl"}
    assert LauncherConfig(eval_data=Path("h.jsonl")).eval_data == {"held_out": tmp_path / "h.jsonl"}
    recipe = write(tmp_path, "eval_data:\n  mcqa: m.jsonl\n  wa: w.jsonl\n")
    assert list(load(["--config", str(recipe)])[0].eval_data) == ["mcqa", "wa"]
    assert LauncherConfig().eval_data == {}
