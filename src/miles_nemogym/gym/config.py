"""The ``mini_swe_agent_2`` server config, composed by NeMo-Gym's own config parser
(why: docs/data-and-checks.md, "Running the server")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from miles_nemogym.gym.venv import GymEnvironmentError, GymVenv, child_environment, run_in_gym
from miles_nemogym.gym.wheel import read_member
from miles_nemogym.yaml_file import YamlFileError, read_mapping
from miles_nemogym.yaml_file import load as load_yaml

__all__ = ["SANDBOXES", "ServeOptions"]

SERVER_NAME = "mini_swe_agent_2"
"""The top-level config key of the agent server in nemo-gym's config."""


# Every provider nemo-gym 0.7.0 registers (`nemo_gym/sandbox/providers/registry.py`).
SandboxName = Literal[
    "docker", "daytona", "e2b", "ecs_fargate", "opensandbox", "openshell", "enroot", "apptainer", "local"
]
SANDBOXES: tuple[str, ...] = get_args(SandboxName)

RAY_HEAD_KEY = "ray_head_node_address"
"""nemo-gym's config key: set, the server joins that Ray cluster instead of starting its own."""

AGENT_CONFIG = Path("responses_api_agents/mini_swe_agent_2/configs/mini_swe_agent_2.yaml")
MODEL_CONFIG = Path("responses_api_models/vllm_model/configs/vllm_model.yaml")

# Never dialled: each /run names its own policy endpoint. Port 9 (discard) on loopback,
# so a /run that forgot policy_base_url fails fast instead of reaching something real.
PLACEHOLDER_POLICY_URL = "http://127.0.0.1:9/v1"

# What the local provider needs on a plain host (docs/upstream.md, NeMo-Gym): `cwd: ""` gives each episode
# its own temporary workspace, not /testbed on the host; it refuses any `user`; there is no conda to activate.
LOCAL_ENVIRONMENT_KWARGS: dict[str, Any] = {
    "cwd": "",
    "activate_conda": False,
    "user": None,
    "conda_env": "testbed",
}


def provider_config_path(sandbox: str) -> Path:
    """The provider config nemo-gym ships, relative to site-packages."""
    return Path("nemo_gym/sandbox/providers") / sandbox / "configs" / f"{sandbox}.yaml"


class ServeOptions(BaseModel):
    """What ``miles-nemogym serve`` (and the test fixtures) can choose about the server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sandbox: SandboxName = "local"
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port")
    concurrency: int = Field(default=16, ge=1, description="episodes run at once")
    step_limit: int = Field(default=250, ge=1, description="model calls per episode")
    step_timeout: int = Field(default=600, ge=1, description="seconds per bash command")
    eval_timeout: int = Field(default=1800, ge=1, description="seconds for grading")
    golden: bool = Field(default=False, description="apply the gold patch, no model calls")
    policy_model_name: str = Field(default="policy", min_length=1)
    provider_options: dict[str, Any] = Field(
        default_factory=dict,
        description="merged over the provider's shipped block `sandbox.<provider>`; a path: a YAML file of them",
    )
    ray_address: str | None = Field(default=None, description="host:port of a running Ray cluster to join")

    @field_validator("ray_address")
    @classmethod
    def _ray_address_is_host_port(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if "://" in value:
            raise ValueError(
                f"{value!r}: give the cluster's GCS address as host:port (what `ray start --head` prints); "
                "a Ray Client (ray://) or dashboard URL cannot run the server's tasks, and serve must run "
                "on a node of the cluster"
            )
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{value!r} is not host:port; give the head node's GCS address, e.g. 10.0.0.1:6379")
        return value

    @field_validator("provider_options", mode="before")
    @classmethod
    def _provider_file(cls, value: Any) -> Any:
        return load_provider_options(value) if isinstance(value, Path) else value

    @property
    def instance_name(self) -> str:
        """The instance serve starts the agent server as: its session cookie tells a ``--golden`` server apart."""
        return f"{SERVER_NAME}_{'golden' if self.golden else 'policy'}"

    @field_validator("host")
    @classmethod
    def _host_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("host must not be empty; use 127.0.0.1 (this machine) or 0.0.0.0 (all interfaces)")
        return value.strip()


def load_provider_options(path: Path) -> dict[str, Any]:
    """Provider options from a YAML file: those under ``sandbox.<provider>``, or a whole ``sandbox:`` block."""
    try:
        return read_mapping(
            path,
            "--provider-config",
            utf8_fix="give a YAML file saved as UTF-8",
            expected="a mapping of provider options (e.g. `exec: {default_timeout_s: 300}`)",
        )
    except YamlFileError as error:
        raise GymEnvironmentError(str(error)) from None


def _provider_block(options: ServeOptions) -> dict[str, Any]:
    """The ``sandbox`` overrides: user options, then what ``local`` needs on the host."""
    given = options.provider_options
    if set(given) == {"sandbox"} and isinstance(given["sandbox"], dict):
        block: dict[str, Any] = dict(given["sandbox"])
        unknown = sorted(set(block) - {options.sandbox, "default_metadata"})
        if unknown:
            raise GymEnvironmentError(
                f"provider options: the `sandbox` block names {unknown}, but the server runs the "
                f"{options.sandbox!r} provider; put its options under `sandbox.{options.sandbox}`"
            )
        return block
    return {options.sandbox: dict(given)} if given else {}


def overrides(options: ServeOptions, port: int, state_dir: Path) -> dict[str, Any]:
    """Our layer over the shipped configs (merged last, so it wins)."""
    if port <= 0:
        raise GymEnvironmentError(f"overrides need a concrete port, got {port}")
    agent: dict[str, Any] = {
        "host": options.host,
        "port": port,
        "concurrency": options.concurrency,
        "step_limit": options.step_limit,
        "step_timeout": options.step_timeout,
        "eval_timeout": options.eval_timeout,
        "run_golden": options.golden,
    }
    sandbox = _provider_block(options)
    # nemo-gym ships no config file for some providers (apptainer): the agent's
    # `sandbox_provider: sandbox` must still resolve, to the provider's defaults.
    sandbox.setdefault(options.sandbox, {})
    if options.sandbox == "local":
        agent["sandbox_environment_kwargs"] = dict(LOCAL_ENVIRONMENT_KWARGS)
        sandbox["local"] = dict(sandbox.get("local") or {})
        sandbox["local"].setdefault("workspace_root", str(state_dir / "workspaces"))
    result: dict[str, Any] = {
        "policy_base_url": PLACEHOLDER_POLICY_URL,
        "policy_api_key": "unused",
        "policy_model_name": options.policy_model_name,
        "results_dir": str(state_dir / "results"),
        "cache_dir": str(state_dir / "cache"),
        SERVER_NAME: {"responses_api_agents": {SERVER_NAME: agent}},
        "sandbox": sandbox,
    }
    if options.ray_address:
        result[RAY_HEAD_KEY] = options.ray_address
    return result


def planned_config(options: ServeOptions, port: int, state_dir: Path) -> dict[str, Any]:
    """The config ``serve`` hands nemo-gym, from the wheel alone: the shipped configs, then :func:`overrides`."""
    from miles_nemogym.gym.composition import deep_merged  # here: every CLI command imports this module

    result: dict[str, Any] = {}
    for member in (AGENT_CONFIG, provider_config_path(options.sandbox), MODEL_CONFIG):
        try:
            shipped = load_yaml(read_member(member.as_posix()))
        except KeyError:  # no config file for this provider (apptainer)
            continue
        result = deep_merged(result, shipped or {})
    return deep_merged(result, overrides(options, port, state_dir))


def config_paths(options: ServeOptions, site_packages: Path) -> list[Path]:
    """The shipped configs in nemo-gym's merge order; the provider's where it ships one (not apptainer)."""
    provider = site_packages / provider_config_path(options.sandbox)
    paths = [site_packages / AGENT_CONFIG, *([provider] if provider.is_file() else []), site_packages / MODEL_CONFIG]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise GymEnvironmentError(f"the server venv lacks nemo-gym's config files: {missing}")
    return paths


# Runs inside the server venv: nemo-gym's own parser, offline, no CLI and no env.yaml, each payload on its own;
# a refusal is its error without the config dump (an almost-server's reasons: what the parser printed).
_COMPOSER = """
import contextlib, io, json, sys
from omegaconf import OmegaConf
from nemo_gym.config_types import AlmostServerError
from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
out = []
for payload in json.loads(sys.stdin.read()):
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):
            parsed = GlobalConfigDictParser().parse(
                GlobalConfigDictParserConfig(
                    initial_global_config_dict=OmegaConf.create(payload),
                    skip_load_from_cli=True,
                    skip_load_from_dotenv=True,
                    offline=True,
                )
            )
        out.append({"yaml": OmegaConf.to_yaml(parsed)})
    except AlmostServerError:
        lines = [l for l in printed.getvalue().splitlines() if l.strip() and not set(l.strip()) <= set("\\u2550")]
        out.append({"error": "\\n".join(l for l in lines if "Almost-Servers Detected" not in l)})
    except Exception as error:
        out.append({"error": f"{type(error).__name__}: {error}"})
print("\\n" + json.dumps(out))
"""

_REASON_CHARS = 4000


def parse_configs(
    venv: GymVenv, payloads: list[dict[str, Any]], cwd: Path, what: str, extra_env: dict[str, str] | None = None
) -> list[str]:
    """Each payload through nemo-gym's parser, in one process: its YAML, or a :class:`ConfigRefusal`."""
    env = {**child_environment(), **(extra_env or {})}
    done = run_in_gym(venv, _COMPOSER, stdin=json.dumps(payloads), cwd=cwd, env=env, timeout=300 + 5 * len(payloads))
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise GymEnvironmentError(f"nemo-gym rejected the {what}:\n{done.stderr.strip()[-3000:]}")
    answers = json.loads(lines[-1])
    return [
        answer["yaml"] if "yaml" in answer else ConfigRefusal(str(answer["error"]).strip()[:_REASON_CHARS])
        for answer in answers
    ]


class ConfigRefusal(str):
    """nemo-gym's parser's reason for refusing a config."""


def parse_config(
    venv: GymVenv, payload: dict[str, Any], cwd: Path, what: str, extra_env: dict[str, str] | None = None
) -> str:
    """``payload`` through nemo-gym's parser in ``venv``: the ``NEMO_GYM_CONFIG_DICT`` YAML."""
    [answer] = parse_configs(venv, [payload], cwd, what, extra_env)
    if isinstance(answer, ConfigRefusal):
        raise GymEnvironmentError(f"nemo-gym rejected the {what}: {answer}")
    return answer


def compose_config_yaml(options: ServeOptions, venv: GymVenv, port: int, state_dir: Path) -> str:
    """The ``NEMO_GYM_CONFIG_DICT`` value for these options (nemo-gym's parser, in ``venv``)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    payload = overrides(options, port, state_dir)
    payload["config_paths"] = [str(p) for p in config_paths(options, venv.site_packages)]
    composed = load_yaml(parse_config(venv, payload, state_dir, f"server config for sandbox {options.sandbox!r}"))
    composed[options.instance_name] = composed[SERVER_NAME]
    return json.dumps(composed)  # JSON is YAML: what nemo-gym and every reader of it parse
