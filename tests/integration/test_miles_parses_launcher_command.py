"""Miles' own argument parser accepts the launcher's training command.

For every model family the launcher knows, and with the eval, episode-store, W&B, session
server v2, separate-GPUs and rollout-only settings, the argv ``launcher._command.build_job``
builds goes through Miles' ``parse_args`` (Miles' flags registered on Megatron-LM's parser),
``miles_validate_args`` and Megatron-LM's ``validate_args``, with the job's environment, as
``train.py`` runs them before any GPU work: Miles at ``pins.MILES_COMMIT``, Megatron-LM at
``pins.MEGATRON_COMMIT``, on CPU (``tests/support/megatron_args.py``). The fully async
commands (``train_async.py --fully-async``: every family, every async knob, a two-node split)
also go through the checks ``train_async.py`` makes before its first Ray call; what the
launcher refuses next to ``--fully-async``, given to Miles by hand, Miles refuses too. Two
differences from a GPU node, both stated there: the GPU's architecture is answered as Hopper,
and the one tool-call parser name Miles binds that PyPI's SGLang lacks is registered.
Stand-ins: the checkpoint is a folder with Qwen3-4B-Instruct-2507's ``config.json`` and an
offline Qwen3 tokenizer (no weights), ``--ref-load`` an empty folder. One Miles process
parses every case (~10 s of imports, then ~1 s a case).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.gym import wheel as gym_wheel
from miles_nemogym.launcher import _command as cmd
from miles_nemogym.launcher._config import LauncherConfig
from miles_nemogym.launcher._families import FAMILIES, Parsers, resolve
from miles_nemogym.launcher.run import load_model_args
from tests.support.miles_env import MilesEnv, ensure_megatron_env, ensure_miles_env
from tests.support.miles_harness import env_or_fail, parse_with_miles, say

pytestmark = pytest.mark.integration

MODEL_TYPE = "qwen3-4B-Instruct-2507"
CHECKPOINT_NAME = "Qwen3-4B-Instruct-2507"
"""The default recipe's model; its family (qwen3) is told from this folder name."""

# Qwen3-4B-Instruct-2507's Megatron arguments as Miles' scripts/models/qwen3-4B-Instruct-2507.py
# gives them at the pinned commit (qwen3-4B.py with rotary base 5,000,000). Used when the Miles
# tree has no scripts/models (a trimmed snapshot); a full checkout's own script is used instead.
QWEN3_4B_MODEL_ARGS = (
    *("--swiglu", "--num-layers", "36", "--hidden-size", "2560", "--ffn-hidden-size", "9728"),
    *("--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8"),
    *("--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm"),
    *("--norm-epsilon", "1e-6", "--rotary-base", "5000000", "--vocab-size", "151936"),
    *("--kv-channels", "128", "--qk-layernorm"),
)
# Its config.json values that Miles checks against those arguments (hf_validate_args).
QWEN3_4B_CONFIG = {
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_theta": 5000000,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": True,
}
REPORTED = [
    "tito_model",
    "sglang_reasoning_parser",
    "sglang_tool_call_parser",
    "custom_generate_function_path",
    "custom_agent_function_path",
    "custom_rm_path",
    "dynamic_sampling_filter_path",
    "custom_rollout_log_function_path",
    "custom_eval_rollout_log_function_path",
    "custom_reward_post_process_path",
    "use_session_server",
    "tensor_model_parallel_size",
    "num_layers",
    "hidden_size",
    "rotary_base",
    "world_size",
    "colocate",
    "rollout_num_gpus",
    "eval_datasets",
    "eval_prompt_data",
    "eval_interval",
    "use_wandb",
    "wandb_group",
    "debug_rollout_only",
    "fully_async",
    "rollout_function_path",
    "custom_async_data_buffer_path",
    "async_max_concurrent_samples",
    "max_weight_staleness",
    "async_unused_samples_handler",
    "async_data_buffer_capacity_factor",
    "rollout_submission_granularity",
    "pause_generation_mode",
    "update_weight_transfer_mode",
    "over_sampling_batch_size",
    "balance_data",
    "actor_num_nodes",
    "actor_num_gpus_per_node",
    "pin_rollout_manager_to_head",
]
ASYNC_SPLIT = {"fully_async": True, "actor_gpus_per_node": 2, "rollout_num_gpus": 2}
"""One 4-GPU node, two GPUs training and two generating."""
REFUSED_BY_MILES = {
    # case: (what is done to the launcher's async argv / environment, Miles' words)
    "async-refused-colocate": ("--colocate", "--fully-async cannot colocate"),
    "async-refused-partial-rollout": ("--partial-rollout", "--fully-async does not support --partial-rollout"),
    "async-refused-rollout-function": (
        "--rollout-function-path",
        "--fully-async and --rollout-function-path both select a rollout function",
    ),
    "async-refused-abort": ("abort", "--use-session-server is incompatible with --pause-generation-mode=abort"),
    "async-refused-legacy-rollout": ("MILES_USE_LEGACY_ROLLOUT_V1", "unrecognized arguments"),
}
"""What the launcher refuses next to --fully-async, given to Miles anyway: Miles refuses each."""


def recipes(work: Path) -> dict[str, LauncherConfig]:
    """Each case's recipe; every path in it exists under ``work``."""
    prompts = work / "train.jsonl"
    held_out = work / "held_out.jsonl"
    for path in (prompts, held_out):
        path.write_text(json.dumps({"prompt": "fix it", "metadata": {"instance_id": "x__y-1"}}) + "\n")
    (work / "ref").mkdir(exist_ok=True)
    base = {
        "hf_checkpoint": str(work / CHECKPOINT_NAME),
        "ref_load": work / "ref",
        "save_dir": work / "save",
        "prompt_data": prompts,
    }
    cases = {"default": LauncherConfig.model_validate(base)}
    for family in FAMILIES:
        cases[f"family-{family.family}"] = LauncherConfig.model_validate({**base, "model_family": family.family})
    cases["eval-store-wandb-v2-separate-gpus"] = LauncherConfig.model_validate(
        {
            **base,
            "eval_data": held_out,
            "eval_name": "verified_held_out",
            "eval_samples_per_prompt": 3,
            "eval_interval": 2,
            "eval_temperature": 0.6,
            "eval_top_p": 0.95,
            "eval_max_response_len": 2048,
            "episode_dir": work / "episodes",
            "wandb_project": "swe-grpo",
            "wandb_group": "nemogym",
            "session_server_version": "v2",
            "colocate": False,
            "actor_gpus_per_node": 2,
            "rollout_num_gpus": 2,
        }
    )
    cases["debug-rollout-only"] = LauncherConfig.model_validate({**base, "mode": "debug_rollout_only"})
    cases["environments-eval-set-each"] = LauncherConfig.model_validate(
        {**base, "eval_data": {"mcqa": held_out, "swe": held_out}, "nemo_gym_envs": {"mcqa": "http://gym:8001"}}
    )
    for family in FAMILIES:
        cases[f"async-family-{family.family}"] = LauncherConfig.model_validate(
            {**base, **ASYNC_SPLIT, "model_family": family.family}
        )
    cases["async-every-knob-v2-eval"] = LauncherConfig.model_validate(
        {
            **base,
            **ASYNC_SPLIT,
            "async_max_concurrent_samples": 16,
            "max_weight_staleness": 2,
            "async_unused_samples_handler": "retry",
            "async_data_buffer_capacity_factor": 3.0,
            "rollout_submission_granularity": "group",
            "pause_generation_mode": "in_place",
            "balance_data": False,
            "session_server_version": "v2",
            "eval_data": held_out,
        }
    )
    cases["async-two-nodes"] = LauncherConfig.model_validate(
        {**base, "fully_async": True, "num_nodes": 2, "gpus_per_node": 8, "actor_num_nodes": 1,
         "rollout_num_gpus": 8, "rollout_gpus_per_engine": 4, "ray_address": "http://head:8265",
         "update_weight_transfer_mode": "p2p"}
    )  # fmt: skip
    cases["sync-over-sampling"] = LauncherConfig.model_validate({**base, "over_sampling_batch_size": 4})
    for name in REFUSED_BY_MILES:
        cases[name] = LauncherConfig.model_validate({**base, **ASYNC_SPLIT})
    # The control: a flag Miles does not know must come back rejected, with argparse's words.
    cases["unknown-flag"] = LauncherConfig.model_validate({**base, "extra_args": ["--not-a-miles-flag", "1"]})
    return cases


def model_args(miles_tree: Path) -> tuple[str, ...]:
    if (miles_tree / "scripts" / "models" / f"{MODEL_TYPE}.py").is_file():
        return load_model_args(miles_tree, MODEL_TYPE)  # the launcher's own loader, Miles' own script
    return QWEN3_4B_MODEL_ARGS


def parsers_of(config: LauncherConfig) -> Parsers:
    return resolve(config.hf_checkpoint, family=config.model_family)


@pytest.fixture(scope="module")
def megatron_env(request: pytest.FixtureRequest) -> MilesEnv:
    env_or_fail(request, "miles-env", lambda: ensure_miles_env(progress=lambda line: _progress(request, line)))
    return env_or_fail(request, "megatron", lambda: ensure_megatron_env(progress=lambda line: _progress(request, line)))


def _progress(request: pytest.FixtureRequest, line: str) -> None:
    if not line.startswith(" "):
        say(request.config, f"[miles-env] {line}")


@pytest.fixture(scope="module")
def parsed(
    megatron_env: MilesEnv, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, LauncherConfig], dict[str, cmd.Job], Any]:
    """Every case's recipe, job, and what Miles' parser made of the job (one Miles process)."""
    work = tmp_path_factory.mktemp("miles-args")
    configs = recipes(work)
    miles = cmd.MilesInstall(root=megatron_env.source, model_args=model_args(megatron_env.source))
    jobs = {name: cmd.build_job(config, parsers_of(config), miles, environ={}) for name, config in configs.items()}
    for name, (change, _) in REFUSED_BY_MILES.items():
        jobs[name] = _bypassing_the_launcher(jobs[name], change)
    request = {
        "checkpoint": str(work / CHECKPOINT_NAME),
        "tokenizer_cache": str(gym_wheel.cache_dir() / "miles-tokenizer"),
        "config": QWEN3_4B_CONFIG,
        "report": REPORTED,
        "cases": [
            {
                "name": name,
                "script": Path(job.argv[1]).name,
                "argv": job.argv[2:],  # python3 <miles>/train.py
                "env": {key: value for key, value in job.env.items() if key != "PYTHONPATH"},
            }
            for name, job in jobs.items()
        ],
    }
    reply = parse_with_miles(megatron_env, request, log_path=work / "parse.log")
    return configs, jobs, reply


def _bypassing_the_launcher(job: cmd.Job, change: str) -> cmd.Job:
    """``job`` with what the launcher would refuse put in by hand."""
    argv, env = list(job.argv), dict(job.env)
    if change == "abort":
        argv[argv.index("--pause-generation-mode") + 1] = "abort"
    elif change == "MILES_USE_LEGACY_ROLLOUT_V1":
        env[change] = "1"
    elif change == "--rollout-function-path":
        argv += [change, "miles.rollout.inference_rollout.inference_rollout_common.InferenceRolloutFn"]
    else:
        argv.append(change)
    return cmd.Job(argv=argv, env=env)


ACCEPTED = ["default", *(f"family-{family.family}" for family in FAMILIES)]
ACCEPTED += ["eval-store-wandb-v2-separate-gpus", "debug-rollout-only"]
ASYNC_ACCEPTED = [f"async-family-{family.family}" for family in FAMILIES]
ASYNC_ACCEPTED += ["async-every-knob-v2-eval", "async-two-nodes"]
ACCEPTED += [*ASYNC_ACCEPTED, "sync-over-sampling"]


@pytest.mark.parametrize("case", ACCEPTED)
def test_miles_accepts_the_launchers_command(
    case: str, parsed: tuple[dict[str, LauncherConfig], dict[str, cmd.Job], Any]
) -> None:
    configs, jobs, reply = parsed
    result = reply["results"][case]
    assert result["ok"], f"Miles rejected the launcher's command ({case}): {result['error']}"
    values = result["values"]
    parsers = parsers_of(configs[case])
    assert values["tito_model"] == parsers.tito_model
    assert values["sglang_tool_call_parser"] == parsers.tool_call_parser
    assert values["sglang_reasoning_parser"] == parsers.reasoning_parser
    # ... and they are the parsers Miles binds to that --tito-model family.
    assert values["tito_bound_parsers"] == [parsers.reasoning_parser, parsers.tool_call_parser]
    assert values["custom_generate_function_path"] == cmd.GENERATE_FUNCTION
    for flag, path in cmd.HOOKS:
        assert values[flag.removeprefix("--").replace("-", "_")] == path
    assert (values["num_layers"], values["hidden_size"], values["rotary_base"]) == (36, 2560, 5000000)
    assert values["tensor_model_parallel_size"] == 2
    assert jobs[case].env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # Megatron's check with TP > 1 passed on it
    fully_async = case in ASYNC_ACCEPTED
    assert values["fully_async"] is fully_async
    assert Path(jobs[case].argv[1]).name == ("train_async.py" if fully_async else "train.py")
    if fully_async:
        # Miles resolved the rollout to its fully async one, and keeps the launcher's data buffer.
        assert values["rollout_function_path"] == "miles.rollout.fully_async_rollout.FullyAsyncRolloutFn"
        assert values["custom_async_data_buffer_path"] == cmd.ASYNC_DATA_BUFFER
        assert values["colocate"] is False
    else:
        assert values["custom_async_data_buffer_path"] is None


def test_the_async_knobs_and_the_split_reach_miles_as_meant(
    parsed: tuple[dict[str, LauncherConfig], dict[str, cmd.Job], Any],
) -> None:
    _, _, reply = parsed
    results = reply["results"]
    knobs = results["async-every-knob-v2-eval"]["values"]
    assert (knobs["async_max_concurrent_samples"], knobs["max_weight_staleness"]) == (16, 2)
    assert (knobs["async_unused_samples_handler"], knobs["async_data_buffer_capacity_factor"]) == ("retry", 3.0)
    assert (knobs["rollout_submission_granularity"], knobs["pause_generation_mode"]) == ("group", "in_place")
    assert knobs["balance_data"] is False and knobs["use_session_server"] == "v2"
    assert (knobs["rollout_num_gpus"], knobs["actor_num_gpus_per_node"], knobs["world_size"]) == (2, 2, 2)
    two = results["async-two-nodes"]["values"]
    assert (two["actor_num_nodes"], two["actor_num_gpus_per_node"], two["rollout_num_gpus"]) == (1, 8, 8)
    assert two["world_size"] == 8 and two["pin_rollout_manager_to_head"] is True
    assert two["update_weight_transfer_mode"] == "p2p"
    default = results["default"]["values"]
    assert (default["pause_generation_mode"], default["update_weight_transfer_mode"]) == ("retract", "broadcast")
    assert results["sync-over-sampling"]["values"]["over_sampling_batch_size"] == 4


@pytest.mark.parametrize("case", sorted(REFUSED_BY_MILES))
def test_what_the_launcher_refuses_next_to_fully_async_miles_refuses_too(
    case: str, parsed: tuple[dict[str, LauncherConfig], dict[str, cmd.Job], Any]
) -> None:
    _, _, reply = parsed
    result = reply["results"][case]
    assert not result["ok"], f"Miles accepted {case}"
    assert REFUSED_BY_MILES[case][1] in result["error"], result["error"]


def test_the_eval_store_and_layout_settings_reach_miles_as_meant(
    parsed: tuple[dict[str, LauncherConfig], dict[str, cmd.Job], Any],
) -> None:
    configs, jobs, reply = parsed
    results = reply["results"]
    case = "eval-store-wandb-v2-separate-gpus"
    values = results[case]["values"]
    (dataset,) = values["eval_datasets"]
    assert dataset["name"] == "verified_held_out" and dataset["n_samples_per_eval_prompt"] == 3
    assert (
        dataset["metadata_overrides"]
        == cmd.eval_config_document(configs[case])["eval"]["datasets"][0]["metadata_overrides"]
    )
    assert values["eval_interval"] == 2
    assert values["use_session_server"] == "v2"
    assert (values["colocate"], values["rollout_num_gpus"], values["world_size"]) == (False, 2, 2)
    assert values["use_wandb"] and values["wandb_group"] == "nemogym"
    assert jobs[case].env[cmd.EPISODE_DIR_ENV] == str(configs[case].episode_dir)
    assert results["debug-rollout-only"]["values"]["debug_rollout_only"] is True
    assert results["default"]["values"]["eval_datasets"] in ([], None)


def test_one_eval_set_per_environment_reaches_miles_each_marked_with_its_name(
    parsed: tuple[dict[str, LauncherConfig], dict[str, cmd.Job], Any],
) -> None:
    configs, jobs, reply = parsed
    case = "environments-eval-set-each"
    values = reply["results"][case]["values"]
    assert [dataset["name"] for dataset in values["eval_datasets"]] == ["mcqa", "swe"]
    for dataset in values["eval_datasets"]:
        assert dataset["metadata_overrides"] == {"nemogym_role": "eval", "nemogym_eval_set": dataset["name"]}
    held_out = str(configs[case].eval_data["mcqa"])
    assert values["eval_prompt_data"] == ["mcqa", held_out, "swe", held_out]
    assert jobs[case].env["NEMO_GYM_ENVS"] == '{"mcqa": "http://gym:8001"}'


def test_a_flag_miles_does_not_know_is_rejected(
    parsed: tuple[dict[str, LauncherConfig], dict[str, cmd.Job], Any],
) -> None:
    _, _, reply = parsed
    result = reply["results"]["unknown-flag"]
    assert not result["ok"]
    assert "unrecognized arguments: --not-a-miles-flag" in result["error"]


def test_only_the_kimi_parser_name_is_missing_from_pypis_sglang(
    parsed: tuple[dict[str, LauncherConfig], dict[str, cmd.Job], Any],
) -> None:
    """The parser names registered for the check are exactly those PyPI's SGLang 0.5.22 lacks
    (Miles' images use its sglang-miles branch): a new one is a new difference to look at."""
    _, _, reply = parsed
    assert reply["added_tool_call_parsers"] == ["kimi_k2_raw_id"]
