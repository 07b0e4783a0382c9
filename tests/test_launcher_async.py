"""Fully async, disaggregated training from the launcher: the command (``train_async.py
--fully-async``, the async knobs, the data buffer), the GPU split and its dry-run layout, and
every combination Miles refuses, refused before anything starts with the field and the fix.
Also: ``--env`` is not a launcher flag (one meaning per flag: it names a NeMo-Gym environment
everywhere else)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.launcher import _command as cmd
from miles_nemogym.launcher import run
from miles_nemogym.launcher._config import ConfigError, LauncherConfig, load_config, read_yaml
from miles_nemogym.launcher._families import resolve
from tests.support.miles_checkout import MODEL_ARGS, flag_values, make_miles_checkout

MILES = cmd.MilesInstall(root=Path("/opt/miles"), model_args=MODEL_ARGS)
ONE_NODE = {"fully_async": True, "actor_gpus_per_node": 2, "rollout_num_gpus": 2}
"""One 4-GPU node: two GPUs train, two generate."""
TWO_NODES = {
    "fully_async": True,
    "num_nodes": 2,
    "gpus_per_node": 8,
    "actor_num_nodes": 1,
    "rollout_num_gpus": 8,
    "ray_address": "http://head:8265",
}
"""Miles' own async recipe's split, at two 8-GPU nodes: one trains, one generates."""
RECIPE = Path(__file__).resolve().parents[1] / "examples" / "swebench_grpo" / "recipe.yaml"


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/support/clean_env.py


def build(**fields: Any) -> cmd.Job:
    config = LauncherConfig.model_validate(fields)
    return cmd.build_job(config, resolve(config.hf_checkpoint), MILES, {})


def flags_of(job: cmd.Job) -> dict[str, list[str]]:
    return flag_values(job.argv[2 + len(MODEL_ARGS) :])  # asserts each flag appears once


def refused(fragment: str, **fields: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(fields, {})  # as --config keys: named as the recipe spells them
    message = str(caught.value)
    assert fragment in message, message
    return message


# --- the command -------------------------------------------------------------------------


def test_fully_async_runs_train_async_with_the_data_buffer_on_separate_gpus() -> None:
    job = build(**ONE_NODE)
    assert job.argv[:2] == ["python3", "/opt/miles/train_async.py"]
    flags = flags_of(job)
    assert flags["--fully-async"] == []
    assert "--colocate" not in flags  # off by default when fully async
    assert flags["--rollout-num-gpus"] == ["2"]
    assert (flags["--actor-num-nodes"], flags["--actor-num-gpus-per-node"]) == (["1"], ["2"])
    # The buffer is named, never imported here: it lives in the runtime half of the package.
    assert flags["--custom-async-data-buffer-path"] == [cmd.ASYNC_DATA_BUFFER] == ["miles_nemogym.buffer.EpisodeBuffer"]
    for flag, path in cmd.HOOKS:  # every synchronous hook still wired
        assert flags[flag] == [path]
    # Miles' defaults, spelled out so the dry run shows them.
    assert flags["--async-unused-samples-handler"] == ["drop"]
    assert flags["--async-data-buffer-capacity-factor"] == ["2.0"]
    assert flags["--pause-generation-mode"] == ["retract"]
    assert flags["--update-weight-transfer-mode"] == ["broadcast"]
    for unset in ("--async-max-concurrent-samples", "--max-weight-staleness", "--rollout-submission-granularity"):
        assert unset not in flags
    assert "--pin-rollout-manager-to-head" not in flags  # one node: nothing to pin


def test_every_async_knob_reaches_its_miles_flag() -> None:
    flags = flags_of(
        build(
            **ONE_NODE,
            async_max_concurrent_samples=64,
            max_weight_staleness=2,
            async_unused_samples_handler="retry",
            async_data_buffer_capacity_factor=3.5,
            rollout_submission_granularity="group",
            pause_generation_mode="in_place",
            balance_data=False,
        )
    )
    assert flags["--async-max-concurrent-samples"] == ["64"]
    assert flags["--max-weight-staleness"] == ["2"]
    assert flags["--async-unused-samples-handler"] == ["retry"]
    assert flags["--async-data-buffer-capacity-factor"] == ["3.5"]
    assert flags["--rollout-submission-granularity"] == ["group"]
    assert flags["--pause-generation-mode"] == ["in_place"]
    assert "--balance-data" not in flags


def test_the_synchronous_command_has_no_async_flag_and_no_buffer() -> None:
    job = build()
    assert job.argv[1] == "/opt/miles/train.py"
    flags = flags_of(job)
    assert flags["--colocate"] == [] and flags["--balance-data"] == []
    for absent in ("--fully-async", "--custom-async-data-buffer-path", "--async-unused-samples-handler",
                   "--async-data-buffer-capacity-factor", "--over-sampling-batch-size"):  # fmt: skip
        assert absent not in flags
    sampled = flags_of(build(over_sampling_batch_size=4))
    assert sampled["--over-sampling-batch-size"] == ["4"]


def test_a_multi_node_split_trains_on_its_nodes_and_pins_the_session_servers_to_the_head() -> None:
    flags = flags_of(build(**TWO_NODES))
    assert (flags["--actor-num-nodes"], flags["--actor-num-gpus-per-node"]) == (["1"], ["8"])
    assert (flags["--rollout-num-gpus"], flags["--num-gpus-per-node"]) == (["8"], ["8"])
    assert flags["--pin-rollout-manager-to-head"] == []
    # Synchronous multi-node runs pin it too: the Gym hosts dial the head either way.
    sync = flags_of(build(num_nodes=2, ray_address="http://head:8265"))
    assert sync["--pin-rollout-manager-to-head"] == [] and sync["--actor-num-nodes"] == ["2"]


# --- the layout ----------------------------------------------------------------------------


def layout(**fields: Any) -> list[str]:
    return cmd.layout_lines(LauncherConfig.model_validate(fields))


def test_the_layout_says_which_gpus_train_and_which_generate() -> None:
    lines = layout(**ONE_NODE)
    assert lines[0].startswith("# layout: fully async (train_async.py), disaggregated, 1 node x 4 GPUs")
    assert lines[1] == "#   node 1: GPUs 0-1 train, GPUs 2-3 generate"
    assert "rollout: 2 SGLang engines x 1 GPU" in lines[2]
    assert "runs on the node; the Gym hosts dial the address there that routes to the Gym host, port 30000" in lines[3]
    two = layout(**TWO_NODES, router_external_host="10.0.0.1", rollout_gpus_per_engine=4)
    assert two[1:3] == ["#   node 1: GPUs 0-7 train", "#   node 2: GPUs 0-7 generate"]
    assert "rollout: 2 SGLang engines x 4 GPUs" in two[3]
    assert "on the Ray head (--pin-rollout-manager-to-head); the Gym hosts dial 10.0.0.1, port 30000" in two[4]
    partial = layout(fully_async=True, num_nodes=3, gpus_per_node=4, actor_num_nodes=1, rollout_num_gpus=6,
                     ray_address="http://head:8265")  # fmt: skip
    assert partial[1:4] == [
        "#   node 1: GPUs 0-3 train",
        "#   node 2: GPUs 0-3 generate",
        "#   node 3: GPUs 0-1 generate",
    ]
    colocated = layout()
    assert colocated[0].startswith("# layout: synchronous (train.py), colocated")
    assert colocated[1] == "#   node 1: GPUs 0-3 train and generate"


def test_the_dry_run_shows_the_layout_and_the_async_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    miles = make_miles_checkout(tmp_path / "miles")
    argv = ["--dry-run", "--miles-root", str(miles), "--fully-async", "--actor-gpus-per-node", "2",
            "--rollout-num-gpus", "2", "--async-unused-samples-handler", "retry",
            "--max-weight-staleness", "1"]  # fmt: skip
    assert run.main(argv) == 0
    out = capsys.readouterr().out
    assert f"python3 {miles}/train_async.py" in out
    assert "--fully-async \\\n" in out and "--max-weight-staleness 1" in out
    assert "--custom-async-data-buffer-path miles_nemogym.buffer.EpisodeBuffer" in out
    assert "#   node 1: GPUs 0-1 train, GPUs 2-3 generate" in out


def test_the_example_recipe_s_fully_async_block_is_a_valid_async_recipe(tmp_path: Path) -> None:
    """recipe.yaml carries the settings to train fully async, commented out: uncommented (and
    colocate dropped, as the block says), they make a disaggregated train_async.py recipe."""
    lines = RECIPE.read_text().splitlines()
    start = lines.index("# --- fully async, disaggregated (uncomment; drop colocate above) ---")
    block = [line.removeprefix("# ") for line in lines[start + 1 :] if re.fullmatch(r"# [a-z_]+: \S+", line)]
    assert len(block) >= 3, block
    kept = [line for line in lines[:start] if not line.startswith("colocate:")]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("\n".join(kept + block) + "\n")
    config = load_config(read_yaml(recipe), {})
    assert config.fully_async and not config.colocated
    job = cmd.build_job(config, resolve(config.hf_checkpoint), MILES, {})
    assert job.argv[1] == "/opt/miles/train_async.py"
    assert flags_of(job)["--pause-generation-mode"] == ["in_place"]


# --- what Miles refuses, refused first ----------------------------------------------------


def test_fully_async_needs_gpus_of_its_own_for_the_engines() -> None:
    refused("fully_async generates on GPUs of its own: set rollout_num_gpus", fully_async=True)
    refused("fully_async cannot colocate", **ONE_NODE, colocate=True)
    refused(
        "training takes actor_num_nodes x actor_gpus_per_node = 1 x 4 GPUs and rollout_num_gpus 2 more, 6 in all, "
        "but the cluster has num_nodes x gpus_per_node = 4: lower actor_num_nodes or actor_gpus_per_node",
        fully_async=True,
        rollout_num_gpus=2,
    )
    refused("actor_num_nodes (3) exceeds num_nodes (2)", **{**TWO_NODES, "actor_num_nodes": 3})
    refused("actor_gpus_per_node (5) exceeds gpus_per_node (4)", **{**ONE_NODE, "actor_gpus_per_node": 5})
    refused("rollout_num_gpus (3) is not a multiple of rollout_gpus_per_engine (2)",
            **{**ONE_NODE, "actor_gpus_per_node": 1, "rollout_num_gpus": 3, "rollout_gpus_per_engine": 2})  # fmt: skip
    refused("actor_num_nodes must equal num_nodes when colocate is on", num_nodes=2, actor_num_nodes=1)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"max_weight_staleness": 1}, "max_weight_staleness is only read by fully async training: set fully_async"),
        (
            {"async_unused_samples_handler": "retry", "async_max_concurrent_samples": 8},
            "async_max_concurrent_samples, async_unused_samples_handler are only read by fully async training",
        ),
        ({"pause_generation_mode": "abort"}, "--pause-generation-mode / recipe key 'pause_generation_mode': abort"),
        ({"update_weight_transfer_mode": "disk-delta"}, "disk-delta needs folders this launcher does not set"),
        ({"update_weight_transfer_mode": "p2p"}, "p2p needs separate GPUs: turn colocate off, or use broadcast"),
        (
            {**ONE_NODE, "update_weight_transfer_mode": "p2p", "pause_generation_mode": "in_place"},
            "use broadcast with in_place, or retract with p2p",
        ),
        ({**ONE_NODE, "over_sampling_batch_size": 4}, "over_sampling_batch_size has no effect with fully_async"),
        ({"over_sampling_batch_size": 1}, "over_sampling_batch_size (1) is below rollout_batch_size (2)"),
        ({**ONE_NODE, "async_max_concurrent_samples": 3}, "raise it to at least 4"),
        ({**ONE_NODE, "async_data_buffer_capacity_factor": 0.4}, "holds no group"),
    ],
)
def test_settings_miles_refuses_or_ignores_are_named_with_the_fix(fields: dict[str, Any], fragment: str) -> None:
    refused(fragment, **fields)


def test_abort_is_refused_in_synchronous_mode_too() -> None:
    message = refused("use in_place or retract", pause_generation_mode="abort")
    assert "Miles refuses it with its session server" in message


@pytest.mark.parametrize(
    ("extra", "fully_async", "fragment"),
    [
        (["--colocate"], False, "set colocate in the recipe"),
        (["--colocate"], True, "set colocate in the recipe"),
        (["--eval-num-gpus", "2"], False, "never the fleet's"),
        (["--eval-num-gpus=2"], True, "evaluate on the shared engines with --eval-data instead"),
        (["--wandb-key", "wk-secret"], False, "export WANDB_API_KEY instead"),
        (["--wandb-key=wk-secret"], True, "shows in the job's argv"),
        (["--partial-rollout"], True, "next to --fully-async, Miles does not support it"),
        (["--rollout-function-path", "my.rollout"], True, "refuses a second rollout function"),
        (["--recompute-logprobs-via-prefill"], True, "next to --fully-async"),
        (["--rollout-all-samples-process-path", "x.y"], True, "next to --fully-async"),
        (["--multi-lora-n-adapters", "2"], True, "multi-LoRA selects a rollout function of its own"),
        (["--pause-generation-mode", "abort"], True, "which the recipe already sets"),
        (["--custom-async-data-buffer-path", "x.Y"], True, "which the recipe already sets"),
    ],
)
def test_extra_args_miles_refuses_are_refused_by_name(extra: list[str], fully_async: bool, fragment: str) -> None:
    fields = {**ONE_NODE, "extra_args": extra} if fully_async else {"extra_args": extra}
    with pytest.raises(cmd.DuplicateFlagError) as caught:
        build(**fields)
    assert extra[0].split("=")[0] in str(caught.value) and fragment in str(caught.value)


def test_flags_refused_only_next_to_fully_async_pass_in_synchronous_mode() -> None:
    flags = flags_of(build(extra_args=["--partial-rollout", "--rollout-function-path", "my.rollout"]))
    assert flags["--partial-rollout"] == [] and flags["--rollout-function-path"] == ["my.rollout"]


def test_an_async_refusal_stops_the_dry_run_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--dry-run", "--fully-async"]) == run.EXIT_USAGE
    captured = capsys.readouterr()
    assert "set --rollout-num-gpus" in captured.err and "# command" not in captured.out


# --- one meaning per flag: --env ----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--dry-run", "--env", "mcqa=http://127.0.0.1:12101"],
        ["--dry-run", "--env=WANDB_MODE=offline"],
    ],
)
def test_env_is_not_a_launcher_flag_and_says_what_to_use(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(argv) == run.EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""  # no job, no variable 'mcqa=...' in one
    assert "--env is not a launcher flag" in captured.err
    assert "--extra-env NAME=VALUE" in captured.err and "--nemo-gym-env NAME=URL" in captured.err


def test_job_variables_are_extra_env_and_environments_nemo_gym_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    miles = make_miles_checkout(tmp_path / "miles")
    argv = ["--dry-run", "--miles-root", str(miles), "--extra-env", "WANDB_MODE=offline",
            "--nemo-gym-env", "mcqa=http://127.0.0.1:12101"]  # fmt: skip
    assert run.main(argv) == 0
    out = capsys.readouterr().out
    assert "WANDB_MODE=offline" in out
    assert 'NEMO_GYM_ENVS=\'{"mcqa": "http://127.0.0.1:12101"}\'' in out
    assert "#   mcqa: http://127.0.0.1:12101" in out
    assert "mcqa=http" not in out.split("# command")[0]  # never a job variable


def test_help_leads_with_the_singular_environment_flag_as_serve_does() -> None:
    help_text = run.build_parser().format_help()
    text = " ".join(help_text.split())
    assert "--nemo-gym-env NAME=URL[,max_steps=N], --nemo-gym-envs NAME=URL[,max_steps=N]" in text
    assert "NAME as in serve --env NAME and convert --env NAME=FILE" in text
    assert "--extra-env NAME=VALUE" in text
    assert not re.search(r"^\s+(--[a-z-]+ [A-Z=]+, )*--env\b", help_text, re.MULTILINE)  # no such flag
