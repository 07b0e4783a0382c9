"""The launcher's typed recipe: defaults < YAML < flags; each field's docstring is its ``--help``."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.functional_validators import AfterValidator

from miles_nemogym.errors import MilesNemoGymError, describe, message, redact_url
from miles_nemogym.settings import EnvironmentServer, Settings, environment_name_problem, parse_environments, short_name
from miles_nemogym.yaml_file import YamlFileError, read_mapping


class ConfigError(MilesNemoGymError, ValueError):
    """The recipe is invalid; the message names each field and the fix."""


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


LEGACY_ROLLOUT_ENV = "MILES_USE_LEGACY_ROLLOUT_V1"
ENVS_ENV = "NEMO_GYM_ENVS"
_SET_NAME = r"^[A-Za-z0-9_.-]+$"
_SET_NAME_RE = re.compile(_SET_NAME)
# The job runs on Ray, maybe in another folder: relative paths mean the launcher's folder.
_AbsolutePath = Annotated[Path, AfterValidator(Path.absolute)]


def _envs_variable() -> Any:  # NEMO_GYM_ENVS as given: validated as a field, so a bad one is named
    return _env(ENVS_ENV) or {}


_REFUSED_MODES: dict[tuple[str | None, Any], str] = {
    ("pause_generation_mode", "abort"): (
        "abort kills every running episode at each weight update; Miles refuses it with its "
        "session server (and with --fully-async): use in_place or retract"
    ),
    ("update_weight_transfer_mode", "disk-delta"): (
        "disk-delta needs folders this launcher does not set (--update-weight-disk-dir, "
        "--update-weight-local-checkpoint-dir): use broadcast or p2p"
    ),
}
"""Miles' pause and weight-transfer modes this recipe refuses, with why and what to use."""
ASYNC_ONLY = ("async_max_concurrent_samples", "max_weight_staleness", "async_unused_samples_handler",
              "async_data_buffer_capacity_factor")  # fmt: skip
"""Fields only Miles' fully async rollout reads (its flags of the same names): refused without ``fully_async``."""


class LauncherConfig(BaseModel):
    """The recipe. Field names are the YAML keys; ``--field-name`` are the CLI flags."""

    # No inf/NaN: ``rollout_temperature: .inf`` in YAML is a typo, never a setting.
    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True, allow_inf_nan=False)

    # --- run (each section is one of --help's, by run.py's _SECTIONS) -----------------------
    mode: Literal["normal", "debug_rollout_only"] = "normal"
    """``debug_rollout_only``: rollouts without training (Miles' --debug-rollout-only)."""
    preflight_only: bool = False
    """Run the preflight checks and exit (0 when all pass, 2 otherwise); nothing started."""
    skip_prepare: bool = False
    """Do not convert the HF checkpoint to torch_dist (the target must then exist)."""

    # --- model ------------------------------------------------------------------------------
    hf_checkpoint: str = "Qwen/Qwen3-4B-Instruct-2507"
    """HF id or local folder: the policy, its tokenizer and the conversion source."""
    megatron_model_type: str = "qwen3-4B-Instruct-2507"
    """Name of the model's argument script in Miles' ``scripts/models/`` (without .py)."""
    model_family: str | None = None
    """A model family of docs/launcher.md ("Model families and parsers"); guessed from ``hf_checkpoint`` if unset."""
    tito_model: str | None = None
    """Override the family's Miles --tito-model."""
    reasoning_parser: str | None = None
    """Override the family's SGLang reasoning parser (``none`` for no parser)."""
    tool_call_parser: str | None = None
    """Override the family's SGLang tool-call parser."""
    base_dir: _AbsolutePath = Path("/root")
    """Where the converted checkpoint and the run's saves go by default."""
    ref_load: _AbsolutePath | None = None
    """torch_dist checkpoint (default ``<base_dir>/<model name>_torch_dist``)."""
    save_dir: _AbsolutePath | None = None
    """Where training saves (default ``<base_dir>/<model name>_nemogym``)."""
    save_interval: int = Field(default=1000, ge=1)
    """Save a checkpoint every N rollout steps."""

    # --- data -------------------------------------------------------------------------------
    prompt_data: _AbsolutePath = Path("/root/swe_verified.jsonl")
    """Miles prompt data (``miles-nemogym convert`` output): JSONL or parquet."""

    # --- rollout ----------------------------------------------------------------------------
    rollout_gpus_per_engine: int = Field(default=1, ge=1)
    """GPUs per SGLang engine (Miles --rollout-num-gpus-per-engine)."""
    sglang_mem_fraction_static: float = Field(default=0.7, gt=0, le=1)
    """Fraction of GPU memory SGLang reserves for weights and KV cache (0-1]."""
    num_rollout: int = Field(default=3, ge=1)
    """Rollout steps to run (Miles --num-rollout)."""
    rollout_batch_size: int = Field(default=2, ge=1)
    """Prompts per rollout (Miles --rollout-batch-size)."""
    n_samples_per_prompt: int = Field(default=4, ge=1)
    """Episodes per prompt: the GRPO group size (Miles --n-samples-per-prompt)."""
    rollout_max_response_len: int = Field(default=4096, ge=1)
    """Most tokens per model call in an episode (Miles --rollout-max-response-len)."""
    rollout_temperature: float = Field(default=0.8, ge=0)
    """Sampling temperature of the policy during rollouts."""
    rollout_top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling top_p of the policy during rollouts, in (0, 1]."""
    over_sampling_batch_size: int | None = Field(default=None, ge=1)
    """Prompts a synchronous rollout samples at once, >= rollout_batch_size; groups running at a full batch abort."""
    pause_generation_mode: Literal["in_place", "retract"] = "retract"
    """How SGLang pauses requests to update weights: retract (recompute KV cache) or in_place (keep it); no abort."""
    update_weight_transfer_mode: Literal["broadcast", "p2p"] = "broadcast"
    """How new weights reach the engines (Miles --update-weight-transfer-mode); p2p needs separate GPUs and retract."""
    rollout_submission_granularity: Literal["group", "sample"] | None = None
    """When a finished episode frees room for the next group: group or sample (default: sample if fully_async)."""

    # --- fully async ------------------------------------------------------------------------
    fully_async: bool = False
    """Train fully async (train_async.py): engines generate while training runs, on GPUs of their own."""
    async_max_concurrent_samples: int | None = Field(default=None, ge=1)
    """Episodes in flight, at least n_samples_per_prompt (default: rollout_batch_size groups)."""
    max_weight_staleness: int | None = Field(default=None, ge=0)
    """Most weight versions a group may lag and still be trained (default: no limit)."""
    async_unused_samples_handler: Literal["drop", "retry"] = "drop"
    """A group fully async does not train (aborted, too stale): drop it, or retry its prompt."""
    async_data_buffer_capacity_factor: float = Field(default=2.0, gt=0)
    """Finished groups held for training, in rollout_batch_size units; generation waits when it is full."""

    # --- training ---------------------------------------------------------------------------
    miles_root: _AbsolutePath | None = None
    """Miles checkout (holding train.py); default: where the importable ``miles`` package lives."""
    megatron_path: _AbsolutePath = Path("/root/Megatron-LM")
    """Megatron-LM checkout, put on the job's PYTHONPATH as Miles' launchers do."""
    tensor_parallel: int = Field(default=2, ge=1)
    """Megatron tensor-model parallel size for training."""
    pipeline_parallel: int = Field(default=1, ge=1)
    """Megatron pipeline-model parallel size for training."""
    context_parallel: int = Field(default=1, ge=1)
    """Megatron context parallel size for training."""
    global_batch_size: int | None = Field(default=None, ge=1)
    """Default: rollout_batch_size x n_samples_per_prompt (one optimizer step per rollout); a divisor: several."""
    max_seq_len: int = Field(default=16384, ge=1)
    """Longest sequence in tokens, prompt and response (Miles --max-seq-len, --max-tokens-per-gpu)."""
    balance_data: bool = True
    """Give each data-parallel rank a similar token count (Miles --balance-data)."""
    kl_loss_coef: float = Field(default=0.01, ge=0)
    """Weight of the KL loss against the reference model."""
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = "low_var_kl"
    """KL estimator: k1, k2, k3 or low_var_kl."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Weight of the entropy bonus."""
    eps_clip: float = Field(default=0.2, gt=0)
    """PPO clip range below 1 (ratio floor 1 - eps_clip)."""
    eps_clip_high: float = Field(default=0.28, gt=0)
    """PPO clip range above 1 (ratio ceiling 1 + eps_clip_high); at least eps_clip."""
    lr: float = Field(default=1e-6, gt=0)
    """Adam learning rate."""
    weight_decay: float = Field(default=0.1, ge=0)
    """Adam weight decay."""
    adam_beta1: float = Field(default=0.9, gt=0, lt=1)
    """Adam beta1, in (0, 1)."""
    adam_beta2: float = Field(default=0.98, gt=0, lt=1)
    """Adam beta2, in (0, 1)."""
    wandb_project: str | None = None
    """Log to Weights & Biases (the key is read from WANDB_API_KEY, never put on a command line)."""
    wandb_group: str | None = None
    """Weights & Biases run group, which Miles names the run after (with wandb_project; default: the model's name)."""
    extra_args: list[str] = Field(default_factory=list)
    """More Miles flags, appended verbatim; a flag the recipe already sets is refused."""
    extra_env: dict[str, str] = Field(default_factory=dict)
    """More environment variables for the job, NAME=VALUE."""

    # --- cluster ----------------------------------------------------------------------------
    num_nodes: int = Field(default=1, ge=1)
    """Nodes in the cluster; more than 1 needs a running Ray cluster (RAY_ADDRESS)."""
    gpus_per_node: int = Field(default=4, ge=1)
    """GPUs on each node (Miles --num-gpus-per-node)."""
    colocate: bool = True
    """Training and rollout share the GPUs (Miles --colocate); unless given, off with fully_async."""
    actor_num_nodes: int | None = Field(default=None, ge=1)
    """Nodes that train (default: num_nodes); when not colocated, the engines take the GPUs after the training ones."""
    actor_gpus_per_node: int | None = Field(default=None, ge=1)
    """GPUs per training node (Miles --actor-num-gpus-per-node; default: gpus_per_node)."""
    rollout_num_gpus: int | None = Field(default=None, ge=1)
    """GPUs for the SGLang engines when not colocated (required then; Miles --rollout-num-gpus)."""
    ray_address: str | None = Field(default_factory=lambda: _env("RAY_ADDRESS"))
    """Job-submission address of a running Ray cluster (http://head:8265); unset: a local head, reused or started."""
    master_addr: str = Field(default_factory=lambda: _env("MASTER_ADDR") or "127.0.0.1")
    """Address of this node for the Ray head and torch.distributed."""
    ray_port: int = Field(default=6379, ge=1, le=65535)
    """GCS port of a Ray head the launcher starts (workers join ``<master_addr>:<ray_port>``)."""
    ray_dashboard_port: int = Field(default=8265, ge=1, le=65535)
    """Job-submission (dashboard) port of the local Ray head, reused or started."""
    ray_start_args: list[str] = Field(default_factory=list)
    """More ``ray start --head`` arguments, e.g. other ports when another Ray (a NeMo-Gym server's) runs here."""
    keep_ray: bool = False
    """Leave a Ray head this launcher started running after the job."""

    # --- eval -------------------------------------------------------------------------------
    eval_data: dict[str, _AbsolutePath] = Field(default_factory=dict)
    """Held-out prompt data (e.g. ``miles-nemogym convert --holdout-output``): FILE, named by
    eval_name, or NAME=FILE, one eval set each (e.g. one per environment); unset: no eval."""
    eval_name: str = Field(default="held_out", pattern=_SET_NAME)
    """The name of an eval_data FILE given without NAME= in metrics (``eval/<name>``, ``nemogym-eval/<name>/*``)."""
    eval_interval: int = Field(default=5, ge=1)
    """Evaluate every N rollouts (and once before training, as Miles does)."""
    eval_samples_per_prompt: int = Field(default=4, ge=1)
    """Episodes per held-out instance: the k of pass@k."""
    eval_temperature: float | None = Field(default=None, ge=0)
    """Sampling temperature of eval episodes (default: rollout_temperature)."""
    eval_top_p: float | None = Field(default=None, gt=0, le=1)
    """top-p of eval episodes (default: rollout_top_p)."""
    eval_max_response_len: int | None = Field(default=None, ge=1)
    """Tokens per model turn in eval episodes (default: rollout_max_response_len)."""

    # --- NeMo-Gym ---------------------------------------------------------------------------
    store_episodes: bool = True
    """Save every episode (its /run answer and record) per step and role; browse with ``miles-nemogym episodes``."""
    episode_dir: _AbsolutePath | None = None
    """Where episodes are saved (NEMO_GYM_EPISODE_DIR; default ``<save_dir>/episodes``)."""
    session_server_ip: str = "0.0.0.0"
    """Where Miles' session server listens; 0.0.0.0 lets the Gym host dial in on any interface."""
    session_server_port: int = Field(default=30000, ge=1, le=65535)
    """Port of Miles' session server, which the Gym server dials for every model call."""
    session_server_version: Literal["v1", "v2"] = "v1"
    """Miles' session server protocol: v1, or v2."""
    nemo_gym_url: str = Field(default_factory=lambda: _env("NEMO_GYM_URL") or "http://localhost:12000")
    """Base URL of the NeMo-Gym mini_swe_agent_2 server (default: NEMO_GYM_URL, else http://localhost:12000)."""
    nemo_gym_envs: dict[str, EnvironmentServer] = Field(default_factory=_envs_variable)
    """Each environment's resources server: NAME=URL[,max_steps=N], NAME as in ``serve --env NAME`` and ``convert
    --env NAME=FILE``, URL as serve prints; or a NEMO_GYM_ENVS JSON object (default: NEMO_GYM_ENVS, the job's too)."""
    tools_not_served: list[str] = Field(default_factory=list)
    """Environments whose server serves no route for the rows' tools as its verifier only reads the calls (xlam_fc):
    preflight accepts them; each call then gets the server's 404, as under NeMo-Gym's simple_agent."""
    router_external_host: str | None = Field(default_factory=lambda: _env("MILES_ROUTER_EXTERNAL_HOST"))
    """Address of the trainer the Gym host can dial (MILES_ROUTER_EXTERNAL_HOST)."""

    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        # Where each came from (the dry run and preflight say); ``load_config`` names the flag or YAML.
        url = "NEMO_GYM_URL in the environment" if _env("NEMO_GYM_URL") else "the default"
        envs = f"{ENVS_ENV} in the environment" if _env(ENVS_ENV) else f"{ENVS_ENV} unset"
        for name, origin in (("nemo_gym_url", url), ("nemo_gym_envs", envs)):
            self._origins[name] = "the recipe" if name in self.model_fields_set else origin

    @property
    def gym_url_origin(self) -> str:
        return self._origins["nemo_gym_url"]

    @property
    def envs_origin(self) -> str:
        return self._origins["nemo_gym_envs"]

    @model_validator(mode="before")
    @classmethod
    def _name_eval_data(cls, data: Any) -> Any:
        """``eval_data`` as ``{set name: file}``: FILE is named ``eval_name``; a list holds FILE or NAME=FILE items."""
        value = data.get("eval_data") if isinstance(data, dict) else None
        if isinstance(value, (str, Path)):
            value = [value]
        if not isinstance(value, list):
            return data  # unset, a mapping, or something pydantic will refuse with its own message
        sets: dict[str, Any] = {}
        for item in value:
            name, sep, path = str(item).partition("=")
            name = short_name(name)  # ``resources_servers/mcqa`` names the set ``mcqa``
            if not (sep and _SET_NAME_RE.fullmatch(name)):
                name, path = data.get("eval_name") or "held_out", str(item)
            if name in sets:
                raise ValueError(f"two files for eval set {name!r}; name each with NAME=FILE")
            sets[name] = path
        return {**data, "eval_data": sets}

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML's ``num_rollout: true`` would otherwise become 1 rollout without a word (``int | None`` too).
        annotation = cls.model_fields[str(info.field_name)].annotation
        if isinstance(value, bool) and {int, float} & {annotation, *get_args(annotation)}:
            raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
        return value

    @field_validator("eval_data")
    @classmethod
    def _set_names(cls, value: dict[str, Path]) -> dict[str, Path]:
        bad = [name for name in value if not _SET_NAME_RE.fullmatch(name)]
        if bad:
            raise ValueError(f"eval set name {bad[0]!r}: use letters, digits, '_', '-' or '.'")
        return value

    @field_validator("nemo_gym_envs", mode="before")
    @classmethod
    def _read_environments(cls, value: Any) -> Any:
        """NEMO_GYM_ENVS text, a mapping, or the flag's NAME=URL[,max_steps=N] or JSON items, as the plugin parses."""
        if value is None or isinstance(value, str):  # unset, or NEMO_GYM_ENVS's own form
            return parse_environments(value) if value and value.strip() else {}
        if isinstance(value, list):
            merged: dict[str, Any] = {}
            for item in value:
                text = str(item).strip()
                if text.startswith("{"):
                    merged.update(parse_environments(text))
                    continue
                name, sep, rest = text.partition("=")
                url, _, steps = rest.partition(",max_steps=")
                if not (sep and name and url):
                    raise ValueError(
                        f"{text!r}: expected NAME=URL or NAME=URL,max_steps=N (e.g. mcqa=http://gym-host:8001)"
                    )
                if steps and not steps.strip().isdigit():
                    raise ValueError(f"{text!r}: max_steps must be a whole number, as in {name}={url},max_steps=8")
                if name in merged:
                    raise ValueError(f"environment {name!r} is given twice; give each environment once")
                merged[name] = {"url": url, "max_steps": int(steps)} if steps else url
            value = merged
        if isinstance(value, dict):
            plain = {
                str(name): server.model_dump(exclude_none=True) if isinstance(server, EnvironmentServer) else server
                for name, server in value.items()
            }
            return parse_environments(json.dumps(plain)) if plain else {}
        return value

    @field_validator("tools_not_served")
    @classmethod
    def _known_names(cls, value: list[str]) -> list[str]:
        value = [short_name(name) for name in value]
        bad = [(name, problem) for name in value if (problem := environment_name_problem(name))]
        if bad:
            raise ValueError(f"{bad[0][0]!r} is not an environment name: {bad[0][1]}")
        return list(dict.fromkeys(value))

    @field_validator("hf_checkpoint")
    @classmethod
    def _absolute_if_local(cls, value: str) -> str:
        # A local folder (as transformers resolves it, from this folder), else an HF id as given.
        path = Path(value)
        return str(path.absolute()) if value and not path.is_absolute() and path.exists() else value

    @field_validator("nemo_gym_url")
    @classmethod
    def _check_gym_url(cls, value: str) -> str:
        # One definition of a valid Gym URL: the plugin's settings.
        try:
            return Settings.model_validate({"NEMO_GYM_URL": value}).gym_url
        except ValidationError as error:
            raise ValueError(message(error.errors()[0])) from None

    @field_validator("ray_address")
    @classmethod
    def _check_ray_address(cls, value: str | None) -> str | None:
        # Ray's job client reads an address without a scheme as http:// (parse_cluster_info); so do we.
        value = value.strip() if value else None
        if not value:
            return None
        if value == "auto" or value.startswith("ray://"):
            raise ValueError(
                f"{redact_url(value)!r} (also read from RAY_ADDRESS) is not a job-submission address: give the Ray "
                "dashboard's, as in http://HEAD:8265"
            )
        return value if "://" in value else f"http://{value}"

    @field_validator("pause_generation_mode", "update_weight_transfer_mode", mode="before")
    @classmethod
    def _refused_modes(cls, value: Any, info: ValidationInfo) -> Any:
        if (info.field_name, value) in _REFUSED_MODES:
            raise ValueError(_REFUSED_MODES[info.field_name, value])
        return value

    @field_validator("reasoning_parser", "tito_model", "tool_call_parser", "model_family")
    @classmethod
    def _strip(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @field_validator("extra_env")
    @classmethod
    def _no_legacy_rollout(cls, value: dict[str, str]) -> dict[str, str]:
        if LEGACY_ROLLOUT_ENV in value:
            raise ValueError(
                f"{LEGACY_ROLLOUT_ENV} selects Miles' legacy rollout, which has no agentic flags; remove it"
            )
        if ENVS_ENV in value:
            raise ValueError(
                f"give the environments' servers as nemo_gym_envs (--nemo-gym-env NAME=URL), not {ENVS_ENV}"
            )
        return value

    @model_validator(mode="after")
    def _check_consistency(self) -> LauncherConfig:
        problems: list[str] = []
        for name in ("rollout_max_response_len", "eval_max_response_len"):
            if (length := getattr(self, name)) is not None and length > self.max_seq_len:
                problems.append(
                    f"{name} ({length}) exceeds max_seq_len ({self.max_seq_len}); lower it or raise max_seq_len"
                )
        if self.eps_clip_high < self.eps_clip:
            problems.append(f"eps_clip_high ({self.eps_clip_high}) is below eps_clip ({self.eps_clip})")
        problems += self._layout_problems()
        problems += self._async_problems()
        model_parallel = self.tensor_parallel * self.pipeline_parallel * self.context_parallel
        if self.training_gpus % model_parallel:
            problems.append(
                f"training GPUs ({self.training_gpus}) are not a multiple of "
                f"tensor_parallel x pipeline_parallel x context_parallel ({model_parallel})"
            )
        if self.rollout_gpus_per_engine > self.gpus_per_node * self.num_nodes:
            problems.append("rollout_gpus_per_engine exceeds the cluster's GPUs")
        over = self.over_sampling_batch_size
        if over is not None and over < self.rollout_batch_size:
            problems.append(
                f"over_sampling_batch_size ({over}) is below rollout_batch_size ({self.rollout_batch_size}); "
                "Miles samples at least a batch at a time: raise it or leave it unset"
            )
        samples = self.rollout_batch_size * self.n_samples_per_prompt
        if self.global_batch_size is not None and samples % self.global_batch_size:
            # Miles trims each rollout to a multiple of the global batch: paid episodes lost.
            problems.append(
                f"global_batch_size ({self.global_batch_size}) must divide rollout_batch_size x "
                f"n_samples_per_prompt ({samples}), or Miles drops the remainder of every rollout; "
                "leave it unset for one optimizer step per rollout"
            )
        if self.wandb_group and not self.wandb_project:
            problems.append("wandb_group is set without wandb_project: set wandb_project to log to W&B")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _layout_problems(self) -> list[str]:
        """Which GPUs train and which generate, as Miles places them."""
        problems: list[str] = []
        if self.actor_nodes > self.num_nodes:
            problems.append(f"actor_num_nodes ({self.actor_nodes}) exceeds num_nodes ({self.num_nodes})")
        if self.actor_gpus > self.gpus_per_node:
            problems.append(f"actor_gpus_per_node ({self.actor_gpus}) exceeds gpus_per_node ({self.gpus_per_node})")
        if self.colocated:
            if self.actor_gpus_per_node not in (None, self.gpus_per_node):
                problems.append("actor_gpus_per_node must equal gpus_per_node when colocate is on")
            if self.actor_num_nodes not in (None, self.num_nodes):
                problems.append("actor_num_nodes must equal num_nodes when colocate is on")
            return problems
        if self.rollout_num_gpus is None:
            reason = "fully_async generates on GPUs of its own" if self.fully_async else "colocate is off"
            problems.append(
                f"{reason}: set rollout_num_gpus (GPUs for the SGLang engines) and leave room for them, "
                "e.g. actor_gpus_per_node 2 and rollout_num_gpus 2 on one 4-GPU node, or actor_num_nodes 1 "
                "and rollout_num_gpus 8 on two 8-GPU nodes"
            )
            return problems
        available = self.gpus_per_node * self.num_nodes
        if self.training_gpus + self.rollout_num_gpus > available:
            problems.append(
                f"training takes actor_num_nodes x actor_gpus_per_node = {self.actor_nodes} x {self.actor_gpus} "
                f"GPUs and rollout_num_gpus {self.rollout_num_gpus} more, {self.training_gpus + self.rollout_num_gpus}"
                f" in all, but the cluster has num_nodes x gpus_per_node = {available}: lower actor_num_nodes or "
                "actor_gpus_per_node to leave the engines their GPUs"
            )
        if self.rollout_num_gpus % self.rollout_gpus_per_engine:
            problems.append(
                f"rollout_num_gpus ({self.rollout_num_gpus}) is not a multiple of rollout_gpus_per_engine "
                f"({self.rollout_gpus_per_engine})"
            )
        if self.update_weight_transfer_mode == "p2p" and self.pause_generation_mode == "in_place":
            # Miles' own async recipe refuses it (examples/swe-agent-harbor-docker).
            problems.append(
                "update_weight_transfer_mode p2p with pause_generation_mode in_place: the P2P transfer "
                "conflicts with the engines' running NCCL inference; use broadcast with in_place, or retract with p2p"
            )
        return problems

    def _async_problems(self) -> list[str]:
        """What Miles refuses or ignores next to --fully-async, and the knobs only it reads."""
        problems: list[str] = []
        if not self.fully_async:
            only_async = sorted(self.model_fields_set.intersection(ASYNC_ONLY))
            if only_async:
                one = len(only_async) == 1
                problems.append(
                    f"{', '.join(only_async)} {'is' if one else 'are'} only read by fully async training: "
                    f"set fully_async, or remove {'it' if one else 'them'}"
                )
            if self.update_weight_transfer_mode == "p2p" and self.colocated:
                problems.append(
                    "update_weight_transfer_mode p2p needs separate GPUs: turn colocate off, or use broadcast"
                )
            return problems
        if self.colocated:
            problems.append(
                "fully_async cannot colocate: the engines keep generating while training runs (Miles and "
                "train_async.py refuse --colocate); leave colocate unset or off and give the engines rollout_num_gpus"
            )
        if self.over_sampling_batch_size is not None:
            problems.append(
                "over_sampling_batch_size has no effect with fully_async (Miles' fully async worker submits "
                "one group at a time); remove it and set async_max_concurrent_samples for more episodes in flight"
            )
        limit = self.async_max_concurrent_samples
        if limit is not None and limit < self.n_samples_per_prompt:
            problems.append(
                f"async_max_concurrent_samples ({limit}) is below n_samples_per_prompt "
                f"({self.n_samples_per_prompt}): Miles submits whole groups; raise it to at least "
                f"{self.n_samples_per_prompt}"
            )
        if int(self.async_data_buffer_capacity_factor * self.rollout_batch_size) < 1:
            problems.append(
                f"async_data_buffer_capacity_factor x rollout_batch_size "
                f"({self.async_data_buffer_capacity_factor} x {self.rollout_batch_size}) holds no group; "
                "raise it so that at least one finished group fits"
            )
        return problems

    # --- derived values ---------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.hf_checkpoint.rstrip("/").rsplit("/", 1)[-1]

    @property
    def train_script_name(self) -> str:
        """Miles' entry point: ``train_async.py`` runs its fully async loop."""
        return "train_async.py" if self.fully_async else "train.py"

    @property
    def colocated(self) -> bool:
        """Training and rollout share the GPUs: ``colocate``, by default on unless fully async."""
        return self.colocate and not (self.fully_async and "colocate" not in self.model_fields_set)

    @property
    def actor_gpus(self) -> int:
        return self.actor_gpus_per_node or self.gpus_per_node

    @property
    def actor_nodes(self) -> int:
        return self.actor_num_nodes or self.num_nodes

    @property
    def training_gpus(self) -> int:
        return self.actor_nodes * self.actor_gpus

    @property
    def resolved_ref_load(self) -> Path:
        return self.ref_load or self.base_dir / f"{self.model_name}_torch_dist"

    @property
    def resolved_save_dir(self) -> Path:
        return self.save_dir or self.base_dir / f"{self.model_name}_nemogym"

    @property
    def resolved_episode_dir(self) -> Path | None:
        return (self.episode_dir or self.resolved_save_dir / "episodes") if self.store_episodes else None

    @property
    def resolved_global_batch_size(self) -> int:
        return self.global_batch_size or self.rollout_batch_size * self.n_samples_per_prompt


_FIELD_NAME = re.compile(
    r"(?<![\w'-])("
    + "|".join(sorted((n for n in LauncherConfig.model_fields if "_" in n), key=len, reverse=True))
    + r")(?![\w'])"
)
"""A recipe field's name in a message (the ones with ``_``; a bare ``colocate`` reads as a word)."""


def load_config(yaml_values: dict[str, Any] | None, cli_values: dict[str, Any]) -> LauncherConfig:
    """Defaults < YAML < CLI, validated once; ``ConfigError`` names every bad field as the user set it, one a line."""
    merged: dict[str, Any] = {**(yaml_values or {}), **cli_values}

    def label(loc: Sequence[int | str]) -> str:
        return f"--{str(loc[0]).replace('_', '-')} / recipe key {'.'.join(map(str, loc))!r}" if loc else "recipe"

    def spelled(match: re.Match[str]) -> str:
        name = match.group(1)
        return "--" + name.replace("_", "-") if name in cli_values or yaml_values is None else name

    try:
        config = LauncherConfig.model_validate(merged)
    except ValidationError as error:
        unknown = "unknown setting (see `examples/swebench_grpo/run.py --help` for the valid ones)"
        text = describe(error, label=label, unknown_key=unknown, separator="\n  ")
        raise ConfigError("invalid launcher configuration:\n  " + _FIELD_NAME.sub(spelled, text)) from None
    for name, flag in (("nemo_gym_url", "--nemo-gym-url"), ("nemo_gym_envs", "--nemo-gym-env")):
        if name in merged:
            config._origins[name] = flag if name in cli_values else f"{name} in the --config recipe"
    return config


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a YAML recipe file; raises ``ConfigError`` with the fix."""
    try:
        data = read_mapping(
            path, "--config", utf8_fix="save the recipe as UTF-8 YAML", expected="a mapping of settings"
        )
    except YamlFileError as error:
        raise ConfigError(str(error)) from None
    # YAML spellings with dashes are accepted: they read like the flags.
    return {str(key).replace("-", "_"): value for key, value in data.items()}
