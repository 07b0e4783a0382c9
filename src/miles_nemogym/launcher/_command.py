"""Recipe -> the exact Miles training command and job environment (pure: no I/O; docs/launcher.md)."""

from __future__ import annotations

import base64
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from miles_nemogym.episode.record import eval_overrides
from miles_nemogym.errors import MilesNemoGymError, counted, redact_url, redact_urls
from miles_nemogym.launcher._config import ASYNC_ONLY, ENVS_ENV, LauncherConfig
from miles_nemogym.launcher._families import Parsers
from miles_nemogym.settings import ENV_VARS, EnvironmentServer

GENERATE_FUNCTION = "miles.rollout.generate_hub.agentic_tool_call.generate"
HOOKS: tuple[tuple[str, str], ...] = (
    ("--custom-agent-function-path", "miles_nemogym.agent.run"),
    ("--custom-rm-path", "miles_nemogym.agent.reward_func"),
    ("--dynamic-sampling-filter-path", "miles_nemogym.groups.check_episode_group"),
    ("--custom-rollout-log-function-path", "miles_nemogym.metrics.log_rollout"),
    # nemogym-eval/<set>/* (masked episodes set aside); Miles' own eval/* still logged.
    ("--custom-eval-rollout-log-function-path", "miles_nemogym.metrics.log_eval"),
    # Trains a partly failed group over its valid episodes (the filter keeps such groups).
    ("--custom-reward-post-process-path", "miles_nemogym.groups.reward_post_process"),
)
"""This package's hooks, each with the Miles flag that loads it."""
ASYNC_DATA_BUFFER = "miles_nemogym.buffer.EpisodeBuffer"
"""Fully async: replaces Miles' DefaultDataBuffer, which drops a group with an aborted episode (docs/upstream.md)."""


def hooks(config: LauncherConfig) -> tuple[tuple[str, str], ...]:
    """``HOOKS``, and the data buffer when fully async."""
    return (*HOOKS, ("--custom-async-data-buffer-path", ASYNC_DATA_BUFFER)) if config.fully_async else HOOKS


_REFUSED_EXTRA: dict[str, tuple[bool, str]] = {
    # flag: (refused in sync mode too, why and the fix)
    "--colocate": (True, "set colocate in the recipe (--colocate / --no-colocate) instead"),
    "--eval-num-gpus": (
        True,
        "Miles' dedicated eval fleet cannot serve this package's episodes: they reach the policy through "
        "Miles' session servers, which forward to the training engines' router, never the fleet's; "
        "evaluate on the shared engines with --eval-data instead (docs/upstream.md)",
    ),
    "--wandb-key": (
        True,
        "a key on the command line shows in the job's argv and --dry-run; export WANDB_API_KEY "
        "instead (passed to the job, never printed)",
    ),
    "--partial-rollout": (False, "Miles does not support it; remove it"),
    "--rollout-function-path": (
        False,
        "Miles selects its FullyAsyncRolloutFn and refuses a second rollout function; remove it",
    ),
    "--recompute-logprobs-via-prefill": (False, "Miles does not support it; remove it"),
    "--rollout-all-samples-process-path": (False, "Miles does not support it; remove it"),
    "--multi-lora-*": (False, "multi-LoRA selects a rollout function of its own, which Miles refuses; remove it"),
}
"""``extra_args`` flags Miles refuses with this recipe: always, or next to ``--fully-async``."""

_FORWARDED_ENV = (*ENV_VARS, "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG", "HF_HOME", "HF_ENDPOINT",
                  "HF_TOKEN", "WANDB_API_KEY")  # fmt: skip
"""Passed on from the launcher's environment when set: Ray workers see only the job's environment."""
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
HIDDEN = "<hidden>"
_MIN_VALID_ENV = "NEMO_GYM_MIN_VALID_PER_GROUP"
EPISODE_DIR_ENV = "NEMO_GYM_EPISODE_DIR"


class DuplicateFlagError(MilesNemoGymError, ValueError):
    """An ``extra_args`` flag that the recipe already sets, or one Miles refuses with it."""


class GroupSettingError(MilesNemoGymError, ValueError):
    """``NEMO_GYM_MIN_VALID_PER_GROUP`` can never be met with this recipe's group size."""


@dataclass(frozen=True)
class MilesInstall:
    """Where Miles is, and ``scripts/models/<megatron_model_type>.py``'s arguments, one token each."""

    root: Path
    model_args: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    """What is submitted: the entry point's argv, the job's environment and the folder it runs in."""

    argv: list[str]
    env: dict[str, str]
    secret_names: frozenset[str] = field(default_factory=frozenset)
    cwd: Path | None = None

    def display_env(self) -> dict[str, str]:
        """The environment with every secret's value replaced by ``<hidden>`` and URL passwords by ``***``."""
        return {name: (HIDDEN if name in self.secret_names else redact_urls(value)) for name, value in self.env.items()}


def _flags(flags: Mapping[str, object]) -> list[str]:
    """``--flag value`` for each value; ``True``: the flag alone; ``None``/``False``: left out."""
    args: list[str] = []
    for flag, value in flags.items():
        if value is True:
            args.append(flag)
        elif value is not None and value is not False:
            args += [flag, str(value)]
    return args


def train_args(config: LauncherConfig, parsers: Parsers) -> list[str]:
    """Miles' flags for the recipe, each at most once, in upstream's grouping."""

    def same(*names: str) -> dict[str, object]:  # recipe fields named as Miles' flags
        return {"--" + name.replace("_", "-"): getattr(config, name) for name in names}

    fully_async = config.fully_async
    args = _flags(
        {
            # checkpoints
            "--hf-checkpoint": config.hf_checkpoint,
            "--ref-load": config.resolved_ref_load,
            "--save": config.resolved_save_dir,
            "--save-interval": config.save_interval,
            # data and rollout
            "--prompt-data": config.prompt_data,
            "--input-key": "prompt",
            "--metadata-key": "metadata",
            "--rollout-shuffle": True,
            **same("num_rollout", "rollout_batch_size", "n_samples_per_prompt", "rollout_temperature", "rollout_top_p"),
            **same("rollout_max_response_len", "max_seq_len"),
            "--global-batch-size": config.resolved_global_batch_size,
            **same("over_sampling_batch_size", "rollout_submission_granularity", "balance_data", "fully_async"),
            # fully async only
            **(same(*ASYNC_ONLY) if fully_async else {}),
            # GRPO
            "--advantage-estimator": "grpo",
            "--use-kl-loss": True,
            **same("kl_loss_coef", "kl_loss_type", "entropy_coef", "eps_clip", "eps_clip_high"),
            # optimizer (Megatron-LM)
            "--optimizer": "adam",
            "--lr": config.lr,
            "--lr-decay-style": "constant",
            **same("weight_decay", "adam_beta1", "adam_beta2"),
            # parallelism and memory (Megatron-LM)
            "--tensor-model-parallel-size": config.tensor_parallel,
            "--pipeline-model-parallel-size": config.pipeline_parallel,
            "--context-parallel-size": config.context_parallel,
            "--expert-model-parallel-size": 1,
            "--expert-tensor-parallel-size": 1,
            "--recompute-granularity": "full",
            "--recompute-method": "uniform",
            "--recompute-num-layers": 1,
            "--use-dynamic-batch-size": True,
            "--max-tokens-per-gpu": config.max_seq_len,
            # SGLang engines
            "--rollout-num-gpus-per-engine": config.rollout_gpus_per_engine,
            **same("sglang_mem_fraction_static"),
            "--sglang-reasoning-parser": parsers.reasoning_parser,
            "--sglang-tool-call-parser": parsers.tool_call_parser,
            # the agentic rollout chain
            "--custom-generate-function-path": GENERATE_FUNCTION,
            **dict(hooks(config)),
            "--use-session-server": "v2" if config.session_server_version == "v2" else True,
            **same("session_server_ip", "session_server_port"),
            "--tito-model": parsers.tito_model,
            # Agent harnesses (opencode) replay earlier tool calls with their arguments re-serialized; Miles'
            # loose_tool_call matcher compares those as JSON, strict would roll the session back and train
            # only the last turn. It accepts everything strict does (docs/environments.md, "Harness environments").
            "--session-message-matcher": "loose_tool_call",
            # model numerics (as upstream's launchers)
            "--attention-dropout": 0.0,
            "--hidden-dropout": 0.0,
            "--accumulate-allreduce-grads-in-fp32": True,
            "--attention-softmax-in-fp32": True,
            "--attention-backend": "flash",
            # cluster layout; Miles assumes 8 GPUs per node unless told (engine placement, port allocation)
            "--colocate": config.colocated,
            "--rollout-num-gpus": None if config.colocated else config.rollout_num_gpus,
            "--actor-num-nodes": config.actor_nodes,
            "--actor-num-gpus-per-node": config.actor_gpus,
            "--num-gpus-per-node": config.gpus_per_node,
            # The session servers, the router and every agent.run live in Miles' RolloutManager, a
            # CPU actor Ray may place on any node: on the head, they are where the Gym hosts dial.
            "--pin-rollout-manager-to-head": config.num_nodes > 1,
            # weight updates
            **same("pause_generation_mode", "update_weight_transfer_mode"),
            "--use-wandb": bool(config.wandb_project),
            "--wandb-project": config.wandb_project or None,
            # Miles names the run <group>_<random id> and fails without a group: the model's name by default.
            "--wandb-group": (config.wandb_group or config.model_name) if config.wandb_project else None,
            "--debug-rollout-only": config.mode == "debug_rollout_only",
        }
    )
    args += eval_args(config)
    return args + _checked_extra_args(args, config.extra_args, fully_async=fully_async)


def layout_lines(config: LauncherConfig) -> list[str]:
    """Which GPUs of which node train and which generate, as Miles places them (node IP order, training first)."""
    mode = "fully async (train_async.py)" if config.fully_async else "synchronous (train.py)"
    split = "colocated" if config.colocated else "disaggregated"
    lines = [
        f"# layout: {mode}, {split}, {counted(config.num_nodes, 'node')} x {counted(config.gpus_per_node, 'GPU')}; "
        "nodes in IP order, as Miles places its GPUs"
    ]
    training = config.training_gpus
    rollout = 0 if config.colocated else config.rollout_num_gpus or 0
    for node in range(config.num_nodes):
        first = node * config.gpus_per_node
        parts = []
        for start, stop, role in (
            (0, training, "train and generate" if config.colocated else "train"),
            (training, training + rollout, "generate"),
        ):
            low, high = max(start, first) - first, min(stop, first + config.gpus_per_node) - first
            if low < high:
                parts.append(f"{f'GPU {low}' if high - low == 1 else f'GPUs {low}-{high - 1}'} {role}")
        lines.append(f"#   node {node + 1}: {', '.join(parts) or 'no GPU used'}")
    engines = (rollout or training) // config.rollout_gpus_per_engine
    lines.append(
        f"#   training: {counted(config.actor_nodes, 'node')} x {counted(config.actor_gpus, 'GPU')}, "
        f"TP {config.tensor_parallel} PP {config.pipeline_parallel} CP {config.context_parallel}; "
        f"rollout: {counted(engines, 'SGLang engine')} x {counted(config.rollout_gpus_per_engine, 'GPU')}"
    )
    where = "on the Ray head (--pin-rollout-manager-to-head)" if config.num_nodes > 1 else "on the node"
    host = config.router_external_host or "the address there that routes to the Gym host"
    lines.append(
        f"#   Miles' RolloutManager (session servers, router, every agent.run) runs {where}; "
        f"the Gym hosts dial {host}, port {config.session_server_port}"
    )
    return lines


def eval_config_document(config: LauncherConfig) -> dict[str, Any]:
    """Miles' ``--eval-config``: per set, its ``metadata_overrides`` and samples per prompt (a benchmark's repeats)."""
    from miles_nemogym.gym.benchmarks import file_benchmark

    marks = {name: file_benchmark(path) for name, path in config.eval_data.items()}
    repeats = {name: mark.num_repeats for name, mark in marks.items() if mark is not None}
    datasets = [
        {
            "name": name,
            "path": str(path),
            "n_samples_per_eval_prompt": repeats.get(name, config.eval_samples_per_prompt),
            "metadata_overrides": eval_overrides(name),
        }
        for name, path in config.eval_data.items()
    ]
    return {"eval": {"datasets": datasets}}


def eval_args(config: LauncherConfig) -> list[str]:
    """Miles' eval flags for the recipe's held-out sets; none without ``eval_data``."""
    if not config.eval_data:
        return []
    document = json.dumps(eval_config_document(config), sort_keys=True)  # JSON is YAML to OmegaConf
    args = ["--eval-config", "base64:" + base64.b64encode(document.encode()).decode()]
    # Overridden by --eval-config in Miles; kept so the dry run shows the sets by name.
    args += ["--eval-prompt-data", *(word for name, path in config.eval_data.items() for word in (name, str(path)))]
    return args + _flags(
        {
            "--eval-interval": config.eval_interval,
            "--n-samples-per-eval-prompt": config.eval_samples_per_prompt,
            "--log-passrate": True,
            "--eval-temperature": config.eval_temperature,
            "--eval-top-p": config.eval_top_p,
            "--eval-max-response-len": config.eval_max_response_len,
        }
    )


def environments_value(servers: Mapping[str, EnvironmentServer]) -> str:
    """``NEMO_GYM_ENVS`` for these servers: a name -> URL, or a JSON object of the fields set."""
    value = {name: server.model_dump(exclude_none=True) for name, server in servers.items()}
    return json.dumps({name: entry["url"] if list(entry) == ["url"] else entry for name, entry in value.items()})


def _check_min_valid(env: Mapping[str, str], n_samples_per_prompt: int) -> None:
    """Refuse a minimum of valid episodes per group that no group can reach."""
    raw = env.get(_MIN_VALID_ENV, "").strip()
    try:
        min_valid = int(raw) if raw else 2
    except ValueError:
        raise GroupSettingError(
            f"{_MIN_VALID_ENV}={raw!r}: expected a whole number such as 2 (0 drops a group on any failure)"
        ) from None
    if min_valid < 0:
        raise GroupSettingError(f"{_MIN_VALID_ENV}={min_valid}: must be 0 or more")
    if min_valid > n_samples_per_prompt:
        given = raw if raw else f"{min_valid} (the default)"
        raise GroupSettingError(
            f"{_MIN_VALID_ENV}={given} exceeds n_samples_per_prompt={n_samples_per_prompt}: a group with a "
            f"failed episode could never be kept; set it to at most {n_samples_per_prompt} (0 drops a group on "
            "any failure) or raise n_samples_per_prompt (GRPO needs at least 2)"
        )


def _checked_extra_args(args: list[str], extra: list[str], *, fully_async: bool = False) -> list[str]:
    set_flags = {token for token in args if token.startswith("--")}
    for token in extra:
        name = token.split("=", 1)[0]
        key = "--multi-lora-*" if name.startswith("--multi-lora-") else name
        always, why = _REFUSED_EXTRA.get(key, (False, ""))
        if why and (always or fully_async):
            why = why if always else f"next to --fully-async, {why}"
            raise DuplicateFlagError(f"extra_args sets {name}, which this recipe cannot run with: {why}")
        if name in set_flags:
            raise DuplicateFlagError(
                f"extra_args sets {name}, which the recipe already sets; change the recipe's "
                f"setting instead (e.g. --{name[2:]} on the launcher) so each flag appears once"
            )
    return list(extra)


def job_episode_dir(config: LauncherConfig, environ: Mapping[str, str]) -> Path | None:
    """The recipe's episode folder, else the caller's NEMO_GYM_EPISODE_DIR, else ``<save_dir>/episodes``; None: off."""
    if config.resolved_episode_dir is None:
        return None
    given = environ.get(EPISODE_DIR_ENV, "").strip()
    return Path(given).absolute() if config.episode_dir is None and given else config.resolved_episode_dir


def job_environment(config: LauncherConfig, miles: MilesInstall, environ: Mapping[str, str]) -> Job:
    """The job's environment; ``environ`` is the launcher's (for forwarded variables)."""
    # The recipe's environments and episode folder, never a stale forwarded value.
    env = {
        name: environ[name] for name in _FORWARDED_ENV if environ.get(name) and name not in (ENVS_ENV, EPISODE_DIR_ENV)
    }
    pythonpath = [str(miles.root), str(config.megatron_path), *environ.get("PYTHONPATH", "").split(":")]
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            # Megatron's overlap of communication and computation needs a single queue.
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
            "MASTER_ADDR": config.master_addr,
            "no_proxy": ",".join(dict.fromkeys(["127.0.0.1", "localhost", config.master_addr])),
            "PYTHONPATH": ":".join(dict.fromkeys(part for part in pythonpath if part)),
            # The class-based rollout (which registers the agentic flags) in Miles before afd088cb6.
            "MILES_EXPERIMENTAL_ROLLOUT_REFACTOR": "1",
            "NEMO_GYM_URL": config.nemo_gym_url,
        }
    )
    if config.router_external_host:
        env["MILES_ROUTER_EXTERNAL_HOST"] = config.router_external_host
    if config.nemo_gym_envs:
        env[ENVS_ENV] = environments_value(config.nemo_gym_envs)
    if (episode_dir := job_episode_dir(config, environ)) is not None:
        env[EPISODE_DIR_ENV] = str(episode_dir)
    env.update(config.extra_env)
    return Job(argv=[], env=env, secret_names=frozenset(name for name in env if _SECRET_NAME.search(name)))


def build_job(
    config: LauncherConfig, parsers: Parsers, miles: MilesInstall, environ: Mapping[str, str], cwd: Path | None = None
) -> Job:
    """``python3 <miles>/train.py`` (``train_async.py`` when fully async) ``<model args> <recipe flags>``."""
    base = job_environment(config, miles, environ)
    _check_min_valid(base.env, config.n_samples_per_prompt)
    argv = ["python3", str(miles.root / config.train_script_name), *miles.model_args, *train_args(config, parsers)]
    return replace(base, argv=argv, cwd=cwd)


def entrypoint(job: Job) -> str:
    """The job as one shell command (Ray runs entrypoints with a shell), in ``job.cwd`` if set."""
    command = shlex.join(job.argv)
    return command if job.cwd is None else f"cd {shlex.quote(str(job.cwd))} && {command}"


def checkpoint_command(config: LauncherConfig, miles: MilesInstall) -> list[str]:
    """HF -> torch_dist conversion with Miles' tool, on this node's GPUs."""
    script = miles.root / "tools" / "convert_hf_to_torch_dist.py"
    return ["torchrun", "--nproc-per-node", str(config.gpus_per_node), str(script), *miles.model_args,
            "--hf-checkpoint", config.hf_checkpoint, "--save", str(config.resolved_ref_load)]  # fmt: skip


def render(job: Job) -> str:
    """The job as text to read and re-run, one ``--flag value`` a line, secrets and URL passwords hidden."""
    lines = ["# environment of the job"]
    lines += [f"{name}={shlex.quote(value)}" for name, value in sorted(job.display_env().items())]
    lines += ["# command"]
    if job.cwd is not None:
        lines += [f"cd {shlex.quote(str(job.cwd))}"]
    words = [shlex.quote(redact_url(word)) for word in job.argv]
    lines += [words[0] + "".join((" \\\n    " if word.startswith("--") else " ") + word for word in words[1:])]
    return "\n".join(lines)
