"""Recipe -> the exact Miles training command and job environment (pure: no I/O).

Each flag is one Miles' ``train.py`` accepts, and each hook is named by its installed
dotted path; where every flag is registered in Miles: docs/launcher.md.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miles_nemogym import salvage
from miles_nemogym.episode.record import eval_overrides
from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.fit import counted
from miles_nemogym.launcher.config import LauncherConfig
from miles_nemogym.launcher.families import Parsers
from miles_nemogym.redaction import redact_url, redact_urls
from miles_nemogym.settings import ENV_VARS, EnvironmentServer

GENERATE_FUNCTION = "miles.rollout.generate_hub.agentic_tool_call.generate"
_AGENT_FUNCTION = "miles_nemogym.agent.run"
_REWARD_FUNCTION = "miles_nemogym.reward.reward_func"
_GROUP_FILTER = "miles_nemogym.filters.check_episode_group"
_ROLLOUT_LOG_FUNCTION = "miles_nemogym.metrics.log_rollout"
_EVAL_LOG_FUNCTION = "miles_nemogym.metrics.log_eval"
REWARD_POST_PROCESS = salvage.HOOK_PATH

HOOKS: tuple[tuple[str, str], ...] = (
    ("--custom-agent-function-path", _AGENT_FUNCTION),
    ("--custom-rm-path", _REWARD_FUNCTION),
    ("--dynamic-sampling-filter-path", _GROUP_FILTER),
    ("--custom-rollout-log-function-path", _ROLLOUT_LOG_FUNCTION),
    # nemogym-eval/<set>/* (masked episodes set aside); Miles' own eval/* still logged.
    ("--custom-eval-rollout-log-function-path", _EVAL_LOG_FUNCTION),
    # Trains a partly failed group over its valid episodes (the filter keeps such groups).
    ("--custom-reward-post-process-path", REWARD_POST_PROCESS),
)
"""This package's hooks, each with the Miles flag that loads it."""

ASYNC_DATA_BUFFER = "miles_nemogym.buffer.EpisodeBuffer"
"""Fully async: the data buffer replacing Miles' DefaultDataBuffer, which drops a group with
an aborted episode before the group filter sees it (docs/using-with-miles.md)."""
_ASYNC_HOOKS: tuple[tuple[str, str], ...] = (("--custom-async-data-buffer-path", ASYNC_DATA_BUFFER),)


def hooks(config: LauncherConfig) -> tuple[tuple[str, str], ...]:
    """The hooks this recipe wires: ``HOOKS``, and the data buffer when fully async."""
    return HOOKS + _ASYNC_HOOKS if config.fully_async else HOOKS


_REFUSED_EXTRA: dict[str, tuple[bool, str]] = {
    # flag: (refused in sync mode too, why and the fix)
    "--colocate": (True, "set colocate in the recipe (--colocate / --no-colocate) instead"),
    "--eval-num-gpus": (
        True,
        "Miles' dedicated eval fleet cannot serve this package's episodes: they reach the policy "
        "through Miles' session servers, which forward to the training engines' router, never the "
        "fleet's, so eval would run on the training engines under the snapshot's weight version "
        "(and train.py, which exports no snapshot, stops at the first eval); evaluate on the shared "
        "engines with --eval-data instead (docs/upstream.md)",
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

_ROLLOUT_REFACTOR_ENV = "MILES_EXPERIMENTAL_ROLLOUT_REFACTOR"
"""Selects the class-based rollout (which registers the agentic flags) in Miles checkouts
before 2026-08-13 (radixark/miles afd088cb6); later ones use it by default and ignore it."""

_FORWARDED_ENV: tuple[str, ...] = (
    *ENV_VARS,
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "HF_HOME",
    "HF_ENDPOINT",
    "HF_TOKEN",
    "WANDB_API_KEY",
)
"""Variables passed on from the launcher's environment when set: Ray workers only see the
job's runtime environment, not the shell the launcher ran in."""

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
HIDDEN = "<hidden>"


@dataclass(frozen=True)
class MilesInstall:
    """Where Miles is and the Megatron model arguments of the recipe's model."""

    root: Path
    model_args: tuple[str, ...]
    """``scripts/models/<megatron_model_type>.py``'s arguments, one token each."""

    @property
    def checkpoint_script(self) -> Path:
        return self.root / "tools" / "convert_hf_to_torch_dist.py"


@dataclass(frozen=True)
class Job:
    """What is submitted: the entry point's argv and the job's environment variables."""

    argv: list[str]
    env: dict[str, str]
    secret_names: frozenset[str] = field(default_factory=frozenset)
    cwd: Path | None = None
    """The folder the job runs in (the launcher's), whatever folder the Ray head was started in."""

    def display_env(self) -> dict[str, str]:
        """The environment with every secret's value replaced by ``<hidden>`` and URL passwords by ``***``."""
        return {name: (HIDDEN if name in self.secret_names else redact_urls(value)) for name, value in self.env.items()}


def _is_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def _flag(name: str, value: object) -> list[str]:
    return [name, str(value)]


def train_args(config: LauncherConfig, parsers: Parsers) -> list[str]:
    """Miles' flags for the recipe, each at most once, in upstream's grouping."""
    args: list[str] = []
    # checkpoints
    args += _flag("--hf-checkpoint", config.hf_checkpoint)
    args += _flag("--ref-load", config.resolved_ref_load)
    args += _flag("--save", config.resolved_save_dir)
    args += _flag("--save-interval", config.save_interval)
    # data and rollout
    args += _flag("--prompt-data", config.prompt_data)
    args += _flag("--input-key", "prompt")
    args += _flag("--metadata-key", "metadata")
    args += ["--rollout-shuffle"]
    args += _flag("--num-rollout", config.num_rollout)
    args += _flag("--rollout-batch-size", config.rollout_batch_size)
    args += _flag("--n-samples-per-prompt", config.n_samples_per_prompt)
    args += _flag("--rollout-temperature", config.rollout_temperature)
    args += _flag("--rollout-top-p", config.rollout_top_p)
    args += _flag("--rollout-max-response-len", config.rollout_max_response_len)
    args += _flag("--max-seq-len", config.max_seq_len)
    args += _flag("--global-batch-size", config.resolved_global_batch_size)
    if config.over_sampling_batch_size is not None:
        args += _flag("--over-sampling-batch-size", config.over_sampling_batch_size)
    if config.rollout_submission_granularity is not None:
        args += _flag("--rollout-submission-granularity", config.rollout_submission_granularity)
    if config.balance_data:
        args += ["--balance-data"]
    args += _async_args(config)
    # GRPO
    args += _flag("--advantage-estimator", "grpo")
    args += ["--use-kl-loss"]
    args += _flag("--kl-loss-coef", config.kl_loss_coef)
    args += _flag("--kl-loss-type", config.kl_loss_type)
    args += _flag("--entropy-coef", config.entropy_coef)
    args += _flag("--eps-clip", config.eps_clip)
    args += _flag("--eps-clip-high", config.eps_clip_high)
    # optimizer (Megatron-LM)
    args += _flag("--optimizer", "adam")
    args += _flag("--lr", config.lr)
    args += _flag("--lr-decay-style", "constant")
    args += _flag("--weight-decay", config.weight_decay)
    args += _flag("--adam-beta1", config.adam_beta1)
    args += _flag("--adam-beta2", config.adam_beta2)
    # parallelism and memory (Megatron-LM)
    args += _flag("--tensor-model-parallel-size", config.tensor_parallel)
    args += _flag("--pipeline-model-parallel-size", config.pipeline_parallel)
    args += _flag("--context-parallel-size", config.context_parallel)
    args += _flag("--expert-model-parallel-size", 1)
    args += _flag("--expert-tensor-parallel-size", 1)
    args += _flag("--recompute-granularity", "full")
    args += _flag("--recompute-method", "uniform")
    args += _flag("--recompute-num-layers", 1)
    args += ["--use-dynamic-batch-size"]
    args += _flag("--max-tokens-per-gpu", config.max_seq_len)
    # SGLang engines
    args += _flag("--rollout-num-gpus-per-engine", config.rollout_gpus_per_engine)
    args += _flag("--sglang-mem-fraction-static", config.sglang_mem_fraction_static)
    if parsers.reasoning_parser is not None:
        args += _flag("--sglang-reasoning-parser", parsers.reasoning_parser)
    args += _flag("--sglang-tool-call-parser", parsers.tool_call_parser)
    # the agentic rollout chain
    args += _flag("--custom-generate-function-path", GENERATE_FUNCTION)
    for flag, path in hooks(config):
        args += _flag(flag, path)
    args += ["--use-session-server", *(["v2"] if config.session_server_version == "v2" else [])]
    args += _flag("--session-server-ip", config.session_server_ip)
    args += _flag("--session-server-port", config.session_server_port)
    args += _flag("--tito-model", parsers.tito_model)
    # Agent harnesses (opencode) replay earlier tool calls with their arguments re-serialized; Miles'
    # loose_tool_call matcher compares those as JSON, strict would roll the session back and train
    # only the last turn. It accepts everything strict does (docs/environments.md, "Harness environments").
    args += _flag("--session-message-matcher", "loose_tool_call")
    # model numerics (as upstream's launchers)
    args += _flag("--attention-dropout", 0.0)
    args += _flag("--hidden-dropout", 0.0)
    args += ["--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32"]
    args += _flag("--attention-backend", "flash")
    # cluster layout
    if config.colocated:
        args += ["--colocate"]
    else:
        args += _flag("--rollout-num-gpus", config.rollout_num_gpus)
    args += _flag("--actor-num-nodes", config.actor_nodes)
    args += _flag("--actor-num-gpus-per-node", config.actor_gpus)
    # Miles assumes 8 GPUs per node unless told (engine placement, port allocation).
    args += _flag("--num-gpus-per-node", config.gpus_per_node)
    if config.num_nodes > 1:
        # The session servers, the router and every agent.run live in Miles' RolloutManager, a
        # CPU actor Ray may place on any node: on the head, they are where the Gym hosts dial.
        args += ["--pin-rollout-manager-to-head"]
    # weight updates
    args += _flag("--pause-generation-mode", config.pause_generation_mode)
    args += _flag("--update-weight-transfer-mode", config.update_weight_transfer_mode)
    if config.wandb_project:
        args += ["--use-wandb", *_flag("--wandb-project", config.wandb_project)]
        if config.wandb_group:
            args += _flag("--wandb-group", config.wandb_group)
    if config.mode == "debug_rollout_only":
        args += ["--debug-rollout-only"]
    args += eval_args(config)
    return args + _checked_extra_args(args, config.extra_args, fully_async=config.fully_async)


def _async_args(config: LauncherConfig) -> list[str]:
    """Miles' fully async flags; none in synchronous mode."""
    if not config.fully_async:
        return []
    args = ["--fully-async"]
    if config.async_max_concurrent_samples is not None:
        args += _flag("--async-max-concurrent-samples", config.async_max_concurrent_samples)
    if config.max_weight_staleness is not None:
        args += _flag("--max-weight-staleness", config.max_weight_staleness)
    args += _flag("--async-unused-samples-handler", config.async_unused_samples_handler)
    args += _flag("--async-data-buffer-capacity-factor", config.async_data_buffer_capacity_factor)
    return args


def layout_lines(config: LauncherConfig) -> list[str]:
    """Which GPUs of which node train and which generate, as Miles places them: one placement
    group over the GPUs, ordered by node IP then GPU index, training first, the engines next."""
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
            low, high = max(start, first), min(stop, first + config.gpus_per_node)
            if low < high:
                parts.append(f"{_gpu_range(low - first, high - first)} {role}")
        lines.append(f"#   node {node + 1}: {', '.join(parts) or 'no GPU used'}")
    engines = (rollout or training) // config.rollout_gpus_per_engine
    lines.append(
        f"#   training: {counted(config.actor_nodes, 'node')} x {counted(config.actor_gpus, 'GPU')},"
        f" TP {config.tensor_parallel}"
        f" PP {config.pipeline_parallel} CP {config.context_parallel}; rollout: {counted(engines, 'SGLang engine')}"
        f" x {counted(config.rollout_gpus_per_engine, 'GPU')}"
    )
    where = "on the Ray head (--pin-rollout-manager-to-head)" if config.num_nodes > 1 else "on the node"
    host = config.router_external_host or "the address there that routes to the Gym host"
    lines.append(
        f"#   Miles' RolloutManager (session servers, router, every agent.run) runs {where}; "
        f"the Gym hosts dial {host}, port {config.session_server_port}"
    )
    return lines


def _gpu_range(low: int, high: int) -> str:
    return f"GPU {low}" if high - low == 1 else f"GPUs {low}-{high - 1}"


def eval_config_document(config: LauncherConfig) -> dict[str, Any]:
    """Miles' ``--eval-config`` document for the held-out sets (``miles/utils/eval_config.py``):
    each one's ``metadata_overrides`` mark its samples with their role and set name, which is
    how the agent function, the ledger and the episode store tell eval from train. A file of a
    NeMo-Gym benchmark's rows (``convert --env BENCHMARK``) is sampled its ``num_repeats`` times
    per prompt, as the benchmark defines; any other file ``eval_samples_per_prompt`` times."""
    from miles_nemogym.gym.benchmarks import file_benchmark

    marks = {name: file_benchmark(Path(path)) for name, path in config.eval_data.items()}
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
    args += _flag("--eval-interval", config.eval_interval)
    args += _flag("--n-samples-per-eval-prompt", config.eval_samples_per_prompt)
    args += ["--log-passrate"]
    if config.eval_temperature is not None:
        args += _flag("--eval-temperature", config.eval_temperature)
    if config.eval_top_p is not None:
        args += _flag("--eval-top-p", config.eval_top_p)
    if config.eval_max_response_len is not None:
        args += _flag("--eval-max-response-len", config.eval_max_response_len)
    return args


class DuplicateFlagError(MilesNemoGymError, ValueError):
    """An ``extra_args`` flag that the recipe already sets, or one Miles refuses with it."""


class GroupSettingError(MilesNemoGymError, ValueError):
    """``NEMO_GYM_MIN_VALID_PER_GROUP`` can never be met with this recipe's group size."""


_MIN_VALID_ENV = "NEMO_GYM_MIN_VALID_PER_GROUP"
EPISODE_DIR_ENV = "NEMO_GYM_EPISODE_DIR"
ENVS_ENV = "NEMO_GYM_ENVS"


def environments_value(servers: Mapping[str, EnvironmentServer]) -> str:
    """``NEMO_GYM_ENVS`` for these servers: a name -> URL, or a JSON object of the fields set
    (``url``, ``max_steps``, ``agent``, ``reward_range``)."""
    value = {name: server.model_dump(exclude_none=True) for name, server in servers.items()}
    return json.dumps({name: entry["url"] if list(entry) == ["url"] else entry for name, entry in value.items()})


def _check_min_valid(env: Mapping[str, str], n_samples_per_prompt: int) -> None:
    """Refuse a minimum of valid episodes per group that no group can reach: Miles'
    rollout loop would then drop every group that has a failure, or every group."""
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


def _refusal(name: str, fully_async: bool) -> str | None:
    """Why ``extra_args`` may not carry ``name`` in this mode, or None."""
    always, why = _REFUSED_EXTRA.get("--multi-lora-*" if name.startswith("--multi-lora-") else name, (False, ""))
    if always:
        return why
    return f"next to --fully-async, {why}" if why and fully_async else None


def _checked_extra_args(args: list[str], extra: list[str], *, fully_async: bool = False) -> list[str]:
    set_flags = {token for token in args if token.startswith("--")}
    for token in extra:
        name = token.split("=", 1)[0]
        why = _refusal(name, fully_async) if name.startswith("--") else None
        if why is not None:
            raise DuplicateFlagError(f"extra_args sets {name}, which this recipe cannot run with: {why}")
        if name in set_flags:
            raise DuplicateFlagError(
                f"extra_args sets {name}, which the recipe already sets; change the recipe's "
                f"setting instead (e.g. --{name[2:]} on the launcher) so each flag appears once"
            )
    return list(extra)


def job_episode_dir(config: LauncherConfig, environ: Mapping[str, str]) -> Path | None:
    """Where the job's episodes go: the recipe's folder, else the caller's NEMO_GYM_EPISODE_DIR,
    else ``<save_dir>/episodes``; absolute (relative to this folder); None when the store is off."""
    if config.resolved_episode_dir is None:
        return None
    given = environ.get(EPISODE_DIR_ENV, "").strip()
    if config.episode_dir is None and given:
        return Path(given).absolute()
    return config.resolved_episode_dir


def job_environment(config: LauncherConfig, miles: MilesInstall, environ: Mapping[str, str]) -> Job:
    """The job's environment; ``environ`` is the launcher's (for forwarded variables)."""
    env: dict[str, str] = {}
    for name in _FORWARDED_ENV:
        value = environ.get(name)
        if value:
            env[name] = value
    pythonpath = [str(miles.root), str(config.megatron_path)]
    if environ.get("PYTHONPATH"):
        pythonpath += [part for part in environ["PYTHONPATH"].split(":") if part]
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            # Megatron's overlap of communication and computation needs a single queue.
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
            "MASTER_ADDR": config.master_addr,
            "no_proxy": ",".join(dict.fromkeys(["127.0.0.1", "localhost", config.master_addr])),
            "PYTHONPATH": ":".join(dict.fromkeys(pythonpath)),
            _ROLLOUT_REFACTOR_ENV: "1",
            "NEMO_GYM_URL": config.nemo_gym_url,
        }
    )
    if config.router_external_host:
        env["MILES_ROUTER_EXTERNAL_HOST"] = config.router_external_host
    # The recipe's environments (by default the caller's NEMO_GYM_ENVS), never a stale forwarded value.
    env.pop(ENVS_ENV, None)
    if config.nemo_gym_envs:
        env[ENVS_ENV] = environments_value(config.nemo_gym_envs)
    episode_dir = job_episode_dir(config, environ)
    env.pop(EPISODE_DIR_ENV, None)
    if episode_dir is not None:
        env[EPISODE_DIR_ENV] = str(episode_dir)
    env.update(config.extra_env)
    secrets = frozenset(name for name in env if _is_secret(name))
    return Job(argv=[], env=env, secret_names=secrets)


def build_job(
    config: LauncherConfig,
    parsers: Parsers,
    miles: MilesInstall,
    environ: Mapping[str, str],
    cwd: Path | None = None,
) -> Job:
    """The whole job: ``python3 <miles>/train.py`` (``train_async.py`` when fully async) ``<model
    args> <recipe flags>``, its env, run in ``cwd``."""
    base = job_environment(config, miles, environ)
    _check_min_valid(base.env, config.n_samples_per_prompt)
    argv = ["python3", str(miles.root / config.train_script_name), *miles.model_args, *train_args(config, parsers)]
    return Job(argv=argv, env=base.env, secret_names=base.secret_names, cwd=cwd)


def entrypoint(job: Job) -> str:
    """The job as one shell command (Ray runs entrypoints with a shell), in ``job.cwd`` if set."""
    command = shlex.join(job.argv)
    return command if job.cwd is None else f"cd {shlex.quote(str(job.cwd))} && {command}"


def checkpoint_command(config: LauncherConfig, miles: MilesInstall) -> list[str]:
    """HF -> torch_dist conversion with Miles' tool, on this node's GPUs."""
    return [
        "torchrun",
        "--nproc-per-node",
        str(config.gpus_per_node),
        str(miles.checkpoint_script),
        *miles.model_args,
        "--hf-checkpoint",
        config.hf_checkpoint,
        "--save",
        str(config.resolved_ref_load),
    ]


def _shell_lines(argv: list[str]) -> str:
    """``argv`` quoted for a POSIX shell, one ``--flag value`` per continued line."""
    words = [shlex.quote(word) for word in argv]
    out = words[:1]
    for word in words[1:]:
        out.append((" \\\n    " if word.startswith("--") else " ") + word)
    return "".join(out)


def render(job: Job) -> str:
    """The job as text a user can read and re-run: env lines, then the command (secrets and URL
    passwords hidden: the job itself gets the real values)."""
    lines = ["# environment of the job"]
    lines += [f"{name}={shlex.quote(value)}" for name, value in sorted(job.display_env().items())]
    lines += ["# command"]
    if job.cwd is not None:
        lines += [f"cd {shlex.quote(str(job.cwd))}"]
    lines += [_shell_lines([redact_url(word) for word in job.argv])]
    return "\n".join(lines)
