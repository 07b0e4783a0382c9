"""The Miles command and job environment the launcher builds."""

from __future__ import annotations

import base64
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from miles_nemogym.launcher import _command as cmd
from miles_nemogym.launcher._config import LauncherConfig, load_config
from miles_nemogym.launcher._families import Parsers, resolve
from tests.support.miles_checkout import MODEL_ARGS, flag_values

MILES = cmd.MilesInstall(root=Path("/opt/miles"), model_args=MODEL_ARGS)

# Where each flag the launcher emits is registered (radixark/miles @ 31f1ca9, Aug 2026):
# A = miles/utils/arguments.py, G = agentic_tool_call._add_arguments, S = SGLang ServerArgs
# under Miles' --sglang- prefix (backends/sglang_utils/arguments.py), M = Megatron-LM (used
# with these spellings by Miles' examples/experimental/nemo-gym/run.py).
KNOWN_FLAGS = {
    "--hf-checkpoint": "A:455",
    "--ref-load": "A:1299",
    "--save": "A:1311",
    "--save-interval": "A:1312",
    "--prompt-data": "A:1022",
    "--input-key": "A:1050",
    "--metadata-key": "A:1060",
    "--rollout-shuffle": "A:575",
    "--num-rollout": "A:982",
    "--rollout-batch-size": "A:1082",
    "--n-samples-per-prompt": "A:1091",
    "--rollout-temperature": "A:505",
    "--rollout-top-p": "A:511",
    "--rollout-max-response-len": "A:536",
    "--max-seq-len": "G:150",
    "--global-batch-size": "A:1097",
    "--balance-data": "A:1110",
    "--advantage-estimator": "A:1422",
    "--use-kl-loss": "A:1448",
    "--kl-loss-coef": "A:1451",
    "--kl-loss-type": "A:1415",
    "--entropy-coef": "A:1468",
    "--eps-clip": "A:1380",
    "--eps-clip-high": "A:1381",
    "--lr": "A:1355",
    "--optimizer": "M",
    "--lr-decay-style": "M",
    "--weight-decay": "M",
    "--adam-beta1": "M",
    "--adam-beta2": "M",
    "--tensor-model-parallel-size": "M",
    "--pipeline-model-parallel-size": "M",
    "--context-parallel-size": "M",
    "--expert-model-parallel-size": "M",
    "--expert-tensor-parallel-size": "M",
    "--recompute-granularity": "M",
    "--recompute-method": "M",
    "--recompute-num-layers": "M",
    "--use-dynamic-batch-size": "A:1142",
    "--max-tokens-per-gpu": "A:1153",
    "--rollout-num-gpus-per-engine": "A:129",
    "--rollout-num-gpus": "A:119",
    "--sglang-mem-fraction-static": "S",
    "--sglang-reasoning-parser": "S",
    "--sglang-tool-call-parser": "S",
    "--custom-generate-function-path": "A:730",
    "--custom-agent-function-path": "G:148",
    "--custom-rm-path": "A:2319",
    "--dynamic-sampling-filter-path": "A:624",
    "--custom-rollout-log-function-path": "A:739",
    "--custom-eval-rollout-log-function-path": "A:749",
    "--eval-config": "A:1203",
    "--eval-prompt-data": "A:1192",
    "--eval-interval": "A:1189",
    "--n-samples-per-eval-prompt": "A:1224",
    "--log-passrate": "A:1949",
    "--eval-temperature": "A:1229",
    "--eval-top-p": "A:1230",
    "--eval-max-response-len": "A:1232",
    "--custom-reward-post-process-path": "A:2329",
    "--use-session-server": "A:2521",
    "--session-server-ip": "A:2533",
    "--session-server-port": "A:2539",
    "--tito-model": "A:2548",
    "--session-message-matcher": "A:2557",
    "--attention-dropout": "M",
    "--hidden-dropout": "M",
    "--accumulate-allreduce-grads-in-fp32": "M",
    "--attention-softmax-in-fp32": "M",
    "--attention-backend": "M",
    "--colocate": "A:144",
    "--actor-num-nodes": "A:107",
    "--actor-num-gpus-per-node": "A:109",
    "--num-gpus-per-node": "A:135",
    "--use-wandb": "A:1903",
    "--wandb-project": "A:1921",
    "--wandb-group": "A:1920",
    "--debug-rollout-only": "A:2068",
    "--pause-generation-mode": "A:786",
    "--update-weight-transfer-mode": "A:837",
    "--fully-async": "A:494",
    "--async-max-concurrent-samples": "A:683",
    "--max-weight-staleness": "A:672",
    "--async-unused-samples-handler": "A:706",
    "--async-data-buffer-capacity-factor": "A:694",
    "--custom-async-data-buffer-path": "A:719",
    "--rollout-submission-granularity": "A:635",
    "--over-sampling-batch-size": "A:611",
    "--pin-rollout-manager-to-head": "A:814",
}


def build(config: LauncherConfig, environ: dict[str, str] | None = None) -> cmd.Job:
    parsers = resolve(
        config.hf_checkpoint,
        family=config.model_family,
        tito_model=config.tito_model,
        reasoning_parser=config.reasoning_parser,
        tool_call_parser=config.tool_call_parser,
    )
    return cmd.build_job(config, parsers, MILES, environ or {})


def recipe_flags(job: cmd.Job) -> dict[str, list[str]]:
    prefix = 2 + len(MODEL_ARGS)  # python3 train.py <model args>
    return flag_values(job.argv[prefix:])


def one(flags: dict[str, list[str]], name: str) -> str:
    (value,) = flags[name]
    return value


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/support/clean_env.py


def test_defaults_reproduce_the_validated_smoke_run() -> None:
    job = build(LauncherConfig())
    assert job.argv[:2] == ["python3", "/opt/miles/train.py"]
    assert tuple(job.argv[2 : 2 + len(MODEL_ARGS)]) == MODEL_ARGS
    flags = recipe_flags(job)
    expected = {
        "--hf-checkpoint": "Qwen/Qwen3-4B-Instruct-2507",
        "--ref-load": "/root/Qwen3-4B-Instruct-2507_torch_dist",
        "--save": "/root/Qwen3-4B-Instruct-2507_nemogym",
        "--prompt-data": "/root/swe_verified.jsonl",
        "--input-key": "prompt",
        "--metadata-key": "metadata",
        "--num-rollout": "3",
        "--rollout-batch-size": "2",
        "--n-samples-per-prompt": "4",
        "--global-batch-size": "8",
        "--max-seq-len": "16384",
        "--rollout-max-response-len": "4096",
        "--max-tokens-per-gpu": "16384",
        "--rollout-temperature": "0.8",
        "--advantage-estimator": "grpo",
        "--kl-loss-coef": "0.01",
        "--kl-loss-type": "low_var_kl",
        "--eps-clip": "0.2",
        "--eps-clip-high": "0.28",
        "--lr": "1e-06",
        "--tensor-model-parallel-size": "2",
        "--rollout-num-gpus-per-engine": "1",
        "--actor-num-nodes": "1",
        "--actor-num-gpus-per-node": "4",
        "--num-gpus-per-node": "4",
        "--session-server-ip": "0.0.0.0",
        "--session-server-port": "30000",
        "--tito-model": "qwen3",
        "--session-message-matcher": "loose_tool_call",
        "--sglang-reasoning-parser": "qwen3",
        "--sglang-tool-call-parser": "qwen25",
    }
    for flag, value in expected.items():
        assert one(flags, flag) == value, flag
    for switch in ("--use-kl-loss", "--colocate", "--use-session-server", "--rollout-shuffle", "--balance-data"):
        assert flags[switch] == [], switch
    for absent in ("--debug-rollout-only", "--use-wandb", "--rollout-num-gpus", "--load"):
        assert absent not in flags


def test_the_whole_hook_chain_is_wired_by_dotted_path() -> None:
    flags = recipe_flags(build(LauncherConfig()))
    assert one(flags, "--custom-generate-function-path") == "miles.rollout.generate_hub.agentic_tool_call.generate"
    assert one(flags, "--custom-agent-function-path") == "miles_nemogym.agent.run"
    assert one(flags, "--custom-rm-path") == "miles_nemogym.agent.reward_func"
    assert one(flags, "--dynamic-sampling-filter-path") == "miles_nemogym.groups.check_episode_group"
    assert one(flags, "--custom-rollout-log-function-path") == "miles_nemogym.metrics.log_rollout"
    # The filter keeps partly failed groups; this hook trains them over their valid episodes.
    assert one(flags, "--custom-reward-post-process-path") == "miles_nemogym.groups.reward_post_process"
    # Upstream's filter would drop our groups' bookkeeping: only ours is given.
    assert "check_no_aborted" not in " ".join(build(LauncherConfig()).argv)


def test_every_flag_is_one_miles_registers_and_appears_once() -> None:
    config = LauncherConfig(
        wandb_project="p",
        wandb_group="g",
        mode="debug_rollout_only",
        eval_data=Path("/data/holdout.jsonl"),
        eval_temperature=0.6,
        eval_top_p=0.95,
        eval_max_response_len=2048,
    )
    flags = recipe_flags(build(config))  # flag_values asserts no repeats
    unknown = set(flags) - set(KNOWN_FLAGS)
    assert not unknown, f"flags without a known Miles/Megatron/SGLang source: {sorted(unknown)}"
    non_colocated = recipe_flags(build(LauncherConfig(colocate=False, actor_gpus_per_node=2, rollout_num_gpus=2)))
    assert not set(non_colocated) - set(KNOWN_FLAGS)


@pytest.mark.parametrize(
    ("n_samples", "environ", "message"),
    [
        (1, {}, "NEMO_GYM_MIN_VALID_PER_GROUP=2 (the default) exceeds n_samples_per_prompt=1"),
        (4, {"NEMO_GYM_MIN_VALID_PER_GROUP": "5"}, "NEMO_GYM_MIN_VALID_PER_GROUP=5 exceeds n_samples_per_prompt=4"),
        (4, {"NEMO_GYM_MIN_VALID_PER_GROUP": "two"}, "NEMO_GYM_MIN_VALID_PER_GROUP='two': expected a whole number"),
        (4, {"NEMO_GYM_MIN_VALID_PER_GROUP": "-1"}, "NEMO_GYM_MIN_VALID_PER_GROUP=-1: must be 0 or more"),
    ],
)
def test_launcher_refuses_a_min_valid_per_group_no_group_can_meet(
    n_samples: int, environ: dict[str, str], message: str
) -> None:
    config = LauncherConfig(n_samples_per_prompt=n_samples, rollout_batch_size=8)
    with pytest.raises(cmd.GroupSettingError, match=re.escape(message)):
        build(config, environ)


@pytest.mark.parametrize(("n_samples", "value"), [(1, "0"), (1, "1"), (4, "4"), (4, "0"), (2, "")])
def test_launcher_accepts_and_forwards_a_min_valid_per_group_that_can_be_met(n_samples: int, value: str) -> None:
    environ = {"NEMO_GYM_MIN_VALID_PER_GROUP": value} if value else {}
    config = LauncherConfig(n_samples_per_prompt=n_samples, rollout_batch_size=8)
    job = build(config, environ)
    assert job.env.get("NEMO_GYM_MIN_VALID_PER_GROUP") == (value or None)
    # Set in the recipe's extra env, it is checked too.
    with pytest.raises(cmd.GroupSettingError):
        build(config.model_copy(update={"extra_env": {"NEMO_GYM_MIN_VALID_PER_GROUP": str(n_samples + 1)}}))


OVERRIDES: dict[str, Any] = {
    "hf_checkpoint": "/models/Qwen3-8B",
    "megatron_model_type": "qwen3-8B",
    "ref_load": "/ckpt/ref",
    "save_dir": "/ckpt/save",
    "prompt_data": "/data/train.parquet",
    "num_nodes": 2,
    "gpus_per_node": 8,
    "rollout_gpus_per_engine": 2,
    "tensor_parallel": 4,
    "pipeline_parallel": 2,
    "context_parallel": 2,
    "sglang_mem_fraction_static": 0.55,
    "num_rollout": 100,
    "rollout_batch_size": 8,
    "n_samples_per_prompt": 8,
    "global_batch_size": 64,
    "max_seq_len": 32768,
    "rollout_max_response_len": 8192,
    "rollout_temperature": 1.0,
    "rollout_top_p": 0.95,
    "save_interval": 20,
    "kl_loss_coef": 0.02,
    "kl_loss_type": "k3",
    "entropy_coef": 0.001,
    "eps_clip": 0.1,
    "eps_clip_high": 0.3,
    "lr": 2e-6,
    "weight_decay": 0.05,
    "adam_beta1": 0.8,
    "adam_beta2": 0.95,
    "session_server_ip": "10.1.2.3",
    "session_server_port": 31000,
    "session_server_version": "v2",
    "tito_model": "qwennext",
    "reasoning_parser": "qwen3-custom",
    "tool_call_parser": "qwen3_coder",
    "wandb_project": "swe",
    "wandb_group": "run-7",
    "mode": "debug_rollout_only",
    "ray_address": "http://head:8265",
}

EXPECTED = {
    "--hf-checkpoint": ["/models/Qwen3-8B"],
    "--ref-load": ["/ckpt/ref"],
    "--save": ["/ckpt/save"],
    "--prompt-data": ["/data/train.parquet"],
    "--actor-num-nodes": ["2"],
    "--actor-num-gpus-per-node": ["8"],
    "--num-gpus-per-node": ["8"],
    "--rollout-num-gpus-per-engine": ["2"],
    "--tensor-model-parallel-size": ["4"],
    "--pipeline-model-parallel-size": ["2"],
    "--context-parallel-size": ["2"],
    "--sglang-mem-fraction-static": ["0.55"],
    "--num-rollout": ["100"],
    "--rollout-batch-size": ["8"],
    "--n-samples-per-prompt": ["8"],
    "--global-batch-size": ["64"],
    "--max-seq-len": ["32768"],
    "--max-tokens-per-gpu": ["32768"],
    "--rollout-max-response-len": ["8192"],
    "--rollout-temperature": ["1.0"],
    "--rollout-top-p": ["0.95"],
    "--save-interval": ["20"],
    "--kl-loss-coef": ["0.02"],
    "--kl-loss-type": ["k3"],
    "--entropy-coef": ["0.001"],
    "--eps-clip": ["0.1"],
    "--eps-clip-high": ["0.3"],
    "--lr": ["2e-06"],
    "--weight-decay": ["0.05"],
    "--adam-beta1": ["0.8"],
    "--adam-beta2": ["0.95"],
    "--session-server-ip": ["10.1.2.3"],
    "--session-server-port": ["31000"],
    "--use-session-server": ["v2"],
    "--tito-model": ["qwennext"],
    "--sglang-reasoning-parser": ["qwen3-custom"],
    "--sglang-tool-call-parser": ["qwen3_coder"],
    "--use-wandb": [],
    "--wandb-project": ["swe"],
    "--wandb-group": ["run-7"],
    "--debug-rollout-only": [],
}


def test_every_override_reaches_its_flag() -> None:
    flags = recipe_flags(build(LauncherConfig(**OVERRIDES)))
    for flag, values in EXPECTED.items():
        assert flags[flag] == values, flag


def test_reasoning_parser_none_drops_the_flag() -> None:
    flags = recipe_flags(build(LauncherConfig(reasoning_parser="none")))
    assert "--sglang-reasoning-parser" not in flags
    assert one(flags, "--sglang-tool-call-parser") == "qwen25"


def test_not_colocated_splits_gpus() -> None:
    flags = recipe_flags(build(LauncherConfig(colocate=False, actor_gpus_per_node=2, rollout_num_gpus=2)))
    assert "--colocate" not in flags
    assert one(flags, "--rollout-num-gpus") == "2"
    assert one(flags, "--actor-num-gpus-per-node") == "2"


def test_extra_args_are_appended_but_never_duplicate_a_recipe_flag() -> None:
    job = build(LauncherConfig(extra_args=["--sglang-cuda-graph-max-bs", "64"]))
    assert job.argv[-2:] == ["--sglang-cuda-graph-max-bs", "64"]
    with pytest.raises(cmd.DuplicateFlagError, match="--num-rollout"):
        build(LauncherConfig(extra_args=["--num-rollout=5"]))


def test_wandb_without_a_group_gets_one_miles_can_suffix() -> None:
    # Miles names the W&B run wandb_group + "_" + a random id (wandb_utils.init_wandb_primary): without
    # --wandb-group, train.py would stop with a TypeError once the cluster runs.
    flags = recipe_flags(build(LauncherConfig(hf_checkpoint="Qwen/Qwen3-4B-Instruct-2507", wandb_project="p")))
    assert "--use-wandb" in flags and one(flags, "--wandb-project") == "p"
    assert one(flags, "--wandb-group") == "Qwen3-4B-Instruct-2507"
    assert one(recipe_flags(build(LauncherConfig(wandb_project="p", wandb_group="g"))), "--wandb-group") == "g"
    with pytest.raises(ValidationError, match="wandb_group is set without wandb_project"):
        LauncherConfig(wandb_group="g")  # it was dropped without a word


def test_job_environment() -> None:
    environ = {
        "NEMO_GYM_URL": "http://ignored-the-config-wins:1",
        "NEMO_GYM_RUN_TIMEOUT": "1800",
        "NEMO_GYM_POLICY_API_KEY": "sk-secret",
        "HF_TOKEN": "hf_secret",
        "NCCL_SOCKET_IFNAME": "eth0",
        "PYTHONPATH": "/site/extra",
        "UNRELATED": "x",
    }
    config = LauncherConfig(
        nemo_gym_url="http://gym:12000/",
        router_external_host="10.0.0.9",
        extra_env={"MY_FLAG": "1", "MY_SERVICE_PASSWORD": "pw"},
    )
    job = build(config, environ)
    env = job.env
    assert env["MILES_EXPERIMENTAL_ROLLOUT_REFACTOR"] == "1"
    assert env["NEMO_GYM_URL"] == "http://gym:12000"
    assert env["MILES_ROUTER_EXTERNAL_HOST"] == "10.0.0.9"
    assert env["NEMO_GYM_RUN_TIMEOUT"] == "1800"
    assert env["NEMO_GYM_POLICY_API_KEY"] == "sk-secret"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["MY_FLAG"] == "1"
    assert env["PYTHONPATH"].split(":") == ["/opt/miles", "/root/Megatron-LM", "/site/extra"]
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "UNRELATED" not in env
    assert "MILES_USE_LEGACY_ROLLOUT_V1" not in env
    assert job.secret_names == {"NEMO_GYM_POLICY_API_KEY", "HF_TOKEN", "MY_SERVICE_PASSWORD"}
    shown = job.display_env()
    assert shown["NEMO_GYM_POLICY_API_KEY"] == shown["HF_TOKEN"] == shown["MY_SERVICE_PASSWORD"] == cmd.HIDDEN


def test_render_is_the_exact_command_and_hides_secrets() -> None:
    config = LauncherConfig(prompt_data=Path("/data/my prompts.jsonl"))
    job = build(config, {"NEMO_GYM_POLICY_API_KEY": "sk-secret"})
    text = cmd.render(job)
    assert "sk-secret" not in text
    env_part, command_part = text.split("# command\n")
    assert "NEMO_GYM_POLICY_API_KEY='<hidden>'" in env_part
    assert shlex.split(command_part.replace("\\\n", " ")) == job.argv
    for line in env_part.splitlines()[1:]:
        name, _, value = line.partition("=")
        assert shlex.split(value) == [job.display_env()[name]]


def test_checkpoint_command_uses_the_node_gpus_and_target() -> None:
    config = LauncherConfig(ref_load=Path("/ckpt/ref"))
    argv = cmd.checkpoint_command(config, MILES)
    assert argv[:3] == ["torchrun", "--nproc-per-node", "4"]
    assert argv[3] == "/opt/miles/tools/convert_hf_to_torch_dist.py"
    assert tuple(argv[4 : 4 + len(MODEL_ARGS)]) == MODEL_ARGS
    assert flag_values(argv[4 + len(MODEL_ARGS) :]) == {
        "--hf-checkpoint": ["Qwen/Qwen3-4B-Instruct-2507"],
        "--save": ["/ckpt/ref"],
    }


def test_parsers_object_is_what_the_command_uses() -> None:
    parsers = Parsers("custom", "default", None, "hermes")
    argv = cmd.train_args(LauncherConfig(), parsers)
    flags = flag_values(argv)
    assert one(flags, "--tito-model") == "default"
    assert one(flags, "--sglang-tool-call-parser") == "hermes"
    assert "--sglang-reasoning-parser" not in flags


def test_eval_wiring_marks_eval_samples_through_miles_eval_config() -> None:
    config = LauncherConfig(
        eval_data=Path("/data/holdout.jsonl"), eval_name="verified", eval_interval=10, eval_samples_per_prompt=8
    )
    flags = recipe_flags(build(config))
    assert one(flags, "--custom-eval-rollout-log-function-path") == "miles_nemogym.metrics.log_eval"
    assert flags["--eval-prompt-data"] == ["verified", "/data/holdout.jsonl"]
    assert one(flags, "--eval-interval") == "10"
    assert one(flags, "--n-samples-per-eval-prompt") == "8"
    assert flags["--log-passrate"] == []
    assert "--eval-temperature" not in flags  # Miles falls back to --rollout-temperature
    encoded = one(flags, "--eval-config")
    assert encoded.startswith("base64:")
    assert json.loads(base64.b64decode(encoded.removeprefix("base64:"))) == {
        "eval": {
            "datasets": [
                {
                    "name": "verified",
                    "path": "/data/holdout.jsonl",
                    "n_samples_per_eval_prompt": 8,
                    "metadata_overrides": {"nemogym_role": "eval", "nemogym_eval_set": "verified"},
                }
            ]
        }
    }
    without = recipe_flags(build(LauncherConfig()))
    assert not any(flag.startswith("--eval") for flag in without) and "--log-passrate" not in without


def test_a_benchmarks_set_is_sampled_its_repeats_and_other_sets_the_flags(tmp_path: Path) -> None:
    marked = tmp_path / "aime25.jsonl"
    mark = {"name": "aime25", "environment": "math_with_judge", "num_repeats": 32}
    marked.write_text(json.dumps({"prompt": [], "metadata": {"nemogym_benchmark": mark}}) + "\n")
    plain = tmp_path / "mcqa.jsonl"
    plain.write_text(json.dumps({"prompt": [], "metadata": {"nemogym_env": "mcqa"}}) + "\n")
    config = LauncherConfig(eval_data=[f"aime25={marked}", f"mcqa={plain}"], eval_samples_per_prompt=4)
    encoded = one(recipe_flags(build(config)), "--eval-config")
    datasets = json.loads(base64.b64decode(encoded.removeprefix("base64:")))["eval"]["datasets"]
    assert {d["name"]: d["n_samples_per_eval_prompt"] for d in datasets} == {"aime25": 32, "mcqa": 4}


def test_episode_store_is_on_by_default_under_the_save_folder() -> None:
    default = build(LauncherConfig(save_dir=Path("/runs/a")))
    assert default.env["NEMO_GYM_EPISODE_DIR"] == "/runs/a/episodes"
    chosen = build(LauncherConfig(episode_dir=Path("/fast/ep")), {"NEMO_GYM_EPISODE_DIR": "/from/env"})
    assert chosen.env["NEMO_GYM_EPISODE_DIR"] == "/fast/ep"
    from_env = build(LauncherConfig(save_dir=Path("/runs/a")), {"NEMO_GYM_EPISODE_DIR": "/from/env"})
    assert from_env.env["NEMO_GYM_EPISODE_DIR"] == "/from/env"
    off = build(LauncherConfig(store_episodes=False), {"NEMO_GYM_EPISODE_DIR": "/from/env"})
    assert "NEMO_GYM_EPISODE_DIR" not in off.env


def test_every_path_handed_to_the_job_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The job runs wherever Ray runs it: a relative path must already mean the launcher's folder.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "Qwen3-4B-Instruct-2507").mkdir(parents=True)
    cli = {"hf_checkpoint": "models/Qwen3-4B-Instruct-2507", "prompt_data": "data/train.jsonl",
           "eval_data": "data/holdout.jsonl", "base_dir": "work", "save_dir": "runs/r1",
           "episode_dir": "eps", "megatron_path": "Megatron-LM"}  # fmt: skip
    job = build(load_config(None, cli))
    flags = recipe_flags(job)
    assert one(flags, "--hf-checkpoint") == f"{tmp_path}/models/Qwen3-4B-Instruct-2507"
    assert one(flags, "--prompt-data") == f"{tmp_path}/data/train.jsonl"
    assert one(flags, "--save") == f"{tmp_path}/runs/r1"
    assert one(flags, "--ref-load") == f"{tmp_path}/work/Qwen3-4B-Instruct-2507_torch_dist"
    assert flags["--eval-prompt-data"] == ["held_out", f"{tmp_path}/data/holdout.jsonl"]
    (document,) = json.loads(base64.b64decode(one(flags, "--eval-config").removeprefix("base64:")))["eval"]["datasets"]
    assert document["path"] == f"{tmp_path}/data/holdout.jsonl"
    assert job.env["NEMO_GYM_EPISODE_DIR"] == f"{tmp_path}/eps"
    assert f"{tmp_path}/Megatron-LM" in job.env["PYTHONPATH"].split(":")
    from_env = build(load_config(None, {"save_dir": "/runs/a"}), {"NEMO_GYM_EPISODE_DIR": "from/env"})
    assert from_env.env["NEMO_GYM_EPISODE_DIR"] == f"{tmp_path}/from/env"
    hub = build(load_config(None, {}))  # not a local folder: an HF id, as given
    assert one(recipe_flags(hub), "--hf-checkpoint") == "Qwen/Qwen3-4B-Instruct-2507"


def test_the_job_runs_in_the_launchers_folder(tmp_path: Path) -> None:
    job = cmd.build_job(LauncherConfig(), resolve("Qwen/Qwen3-4B-Instruct-2507"), MILES, {}, cwd=tmp_path / "my run")
    assert cmd.entrypoint(job) == f"cd '{tmp_path}/my run' && {shlex.join(job.argv)}"
    assert f"\ncd '{tmp_path}/my run'\npython3 /opt/miles/train.py" in cmd.render(job)
