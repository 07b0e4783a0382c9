"""Checks run on the launching node before any GPU time is spent, each failure with its fix; then
the NeMo-Gym checks of :mod:`miles_nemogym.checks`, as ``doctor`` runs them (docs/launcher.md)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from miles_nemogym import checks
from miles_nemogym.checks import CheckResult
from miles_nemogym.data import open_file, prompt_row_problem
from miles_nemogym.episode.record import ENV_KEY, SWE_ENVIRONMENT, Task
from miles_nemogym.errors import MilesNemoGymError, counted
from miles_nemogym.launcher._command import EPISODE_DIR_ENV, MilesInstall, hooks, job_environment, job_episode_dir
from miles_nemogym.launcher._config import LEGACY_ROLLOUT_ENV, LauncherConfig
from miles_nemogym.settings import ENV_VARS, Settings, short_name

_ROWS_CHECKED = 5

GpuCounter = Callable[[Mapping[str, str]], "tuple[int | None, str]"]
"""``count(environ) -> (number of visible GPUs or None, how it was counted)``."""


def _check_legacy_rollout(config: LauncherConfig, environ: Mapping[str, str]) -> CheckResult:
    name = "Miles rollout path"
    value = environ.get(LEGACY_ROLLOUT_ENV, "").strip()
    if value in ("", "0"):
        kind = "fully async (FullyAsyncRolloutFn)" if config.fully_async else "class-based (agentic)"
        return CheckResult.passed(name, f"{kind} rollout")
    also = "; and --fully-async needs the class-based rollout API" if config.fully_async else ""
    return CheckResult.failed(
        name,
        f"{LEGACY_ROLLOUT_ENV}={value!r} selects Miles' legacy rollout, which does not register "
        f"--custom-agent-function-path or --max-seq-len: {config.train_script_name} would stop with "
        f"'unrecognized arguments'{also}",
        f"unset {LEGACY_ROLLOUT_ENV} (or set it to 0) before launching",
    )


def _spec(name: str) -> ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def locate_miles(configured: Path | None) -> Path | None:
    """The Miles checkout: the configured one, else the importable package's parent."""
    spec = _spec("miles") if configured is None else None
    if spec is None or not spec.submodule_search_locations:
        return configured
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


def _check_miles(root: Path | None, config: LauncherConfig) -> CheckResult:
    name = "Miles"
    if root is None:
        return CheckResult.failed(
            name,
            "the 'miles' package is not importable",
            "install Miles from its repository (git clone https://github.com/radixark/miles && "
            "pip install -e miles) in this environment, or pass --miles-root <checkout>",
        )
    update, models = "update Miles: this checkout predates the {} rollout the recipe needs", root / "scripts" / "models"
    needed = {  # each file, with the fix when it is the first one missing
        root / config.train_script_name: (
            "Miles must be a repository checkout (pip install -e <checkout>), not a bare package; "
            "or pass --miles-root <checkout>"
        ),
        root / "miles/rollout/generate_hub/agentic_tool_call.py": update.format("agentic tool-call"),
        **({root / "miles/rollout/fully_async_rollout.py": update.format("fully async")} if config.fully_async else {}),
        models / f"{config.megatron_model_type}.py": (
            f"pass --megatron-model-type with the name of a file in {models} (without .py) that matches --hf-checkpoint"
        ),
    }
    missing = [path for path in needed if not path.is_file()]
    if not missing:
        return CheckResult.passed(name, f"checkout at {root}")
    return CheckResult.failed(name, f"{root}: missing {', '.join(map(str, missing))}", needed[missing[0]])


def _check_megatron(config: LauncherConfig) -> CheckResult:
    name = "Megatron-LM"
    if config.megatron_path.is_dir():
        return CheckResult.passed(name, f"checkout at {config.megatron_path}")
    if _spec("megatron") is not None:
        return CheckResult.passed(name, "the 'megatron' package is importable")
    return CheckResult.failed(
        name,
        f"no checkout at {config.megatron_path} and no importable 'megatron' package",
        "pass --megatron-path <Megatron-LM checkout> (Miles' docker image has it at /root/Megatron-LM)",
    )


def _check_hooks(paths: Sequence[str]) -> CheckResult:
    """Each dotted path imports and names a callable (Miles would fail late otherwise)."""
    name = "rollout hooks"
    for path in paths:
        module_name, _, attribute = path.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except Exception as error:
            return CheckResult.failed(
                name,
                f"{path}: importing {module_name} failed ({type(error).__name__}: {error})",
                "install miles-nemogym in the training environment (pip install -e '.[train]' from its clone) "
                "with the same version as this launcher",
            )
        if not callable(getattr(module, attribute, None)):
            return CheckResult.failed(
                name,
                f"{path}: {module_name} has no callable {attribute!r}",
                "reinstall miles-nemogym: the installed copy does not match this launcher",
            )
    return CheckResult.passed(name, ", ".join(paths))


def _count_gpus(environ: Mapping[str, str]) -> tuple[int | None, str]:
    """Visible GPUs: ``nvidia-smi`` (limited by CUDA_VISIBLE_DEVICES), else torch if installed."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    limit = None
    if visible is not None:  # CUDA reads its list up to the first invalid entry: "-1" (hide every GPU) exposes none
        limit = len(list(itertools.takewhile(lambda part: part and part[0] != "-", map(str.strip, visible.split(",")))))
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is not None:
        try:
            done = subprocess.run(
                [smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return None, f"nvidia-smi failed to run ({error})"
        if done.returncode != 0:
            reason = (done.stderr or done.stdout).strip().splitlines()
            return None, f"nvidia-smi exited {done.returncode}: {reason[0] if reason else 'no output'}"
        found = len([line for line in done.stdout.splitlines() if line.strip()])
        count = found if limit is None else min(found, limit)
        note = "" if limit is None else f", CUDA_VISIBLE_DEVICES={visible}"
        return count, f"nvidia-smi lists {found}{note}"
    if _spec("torch") is not None:
        torch: Any = importlib.import_module("torch")  # optional: never a dependency
        return int(torch.cuda.device_count()), "torch.cuda.device_count()"
    return None, "nvidia-smi is not on PATH and torch is not installed"


def _check_gpus(config: LauncherConfig, environ: Mapping[str, str], counter: GpuCounter) -> CheckResult:
    name = "GPUs"
    count, how = counter(environ)
    if count is None:
        return CheckResult.failed(
            name,
            f"cannot count GPUs: {how}",
            "run on a GPU node with the NVIDIA driver installed (nvidia-smi must work)",
        )
    if count < config.gpus_per_node:
        return CheckResult.failed(
            name,
            f"{count} visible ({how}), the recipe needs {config.gpus_per_node} per node",
            f"run on a node with {config.gpus_per_node} GPUs, free or expose them "
            "(CUDA_VISIBLE_DEVICES), or lower --gpus-per-node (and --tensor-parallel to match)",
        )
    return CheckResult.passed(name, f"{count} visible ({how}); {config.gpus_per_node} used")


_CONVERT = "miles-nemogym convert --input princeton-nlp/SWE-bench_Verified"


def _check_data(name: str, flag: str, path: Path, fix: str) -> CheckResult:
    """A file of prompt rows as Miles reads them: its first rows carry a prompt and an instance."""
    given = f"{flag} {path}"
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "is not a regular file"
        what = what if path.exists() else "does not exist"
        return CheckResult.failed(name, f"{given} {what}", fix)
    if path.suffix not in (".jsonl", ".parquet"):
        return CheckResult.failed(name, f"{given}: Miles reads prompt data from .jsonl or .parquet files only", fix)
    rows: list[Any] = []
    try:  # the first rows, read by the converter's reader
        for raw in itertools.islice(open_file(path), _ROWS_CHECKED):
            if raw.error is not None:
                return CheckResult.failed(name, f"{given}: {raw.where()}: {raw.error}", fix)
            rows.append(raw.data)
    except (OSError, MilesNemoGymError) as error:
        return CheckResult.failed(name, f"{given}: {error}", fix)
    if not rows:
        return CheckResult.failed(name, f"{given} has no rows", fix)
    for number, row in enumerate(rows, start=1):
        if (problem := prompt_row_problem(row)) is not None:
            return CheckResult.failed(name, f"{given} row {number}: {problem}", fix)
    return CheckResult.passed(name, f"{path}: first {counted(len(rows), 'row')} carry a prompt and a task")


def check_prompt_data(config: LauncherConfig) -> CheckResult:
    path = config.prompt_data
    fix = f"convert SWE-bench with `{_CONVERT} --output {path}` and pass that file as --prompt-data"
    return _check_data("prompt data", "--prompt-data", path, fix)


def _check_eval_data(config: LauncherConfig) -> list[CheckResult]:
    """Miles evaluates before the first training step: a bad held-out file fails once the cluster runs."""
    if not config.eval_data:
        return [CheckResult.passed("eval data", "no --eval-data: no held-out evaluation")]
    fix = (
        f"write a held-out set with `{_CONVERT} --output <train.jsonl> --holdout N --holdout-output {{path}}` "
        "and pass that file as --eval-data {name}={path}, or leave --eval-data unset to train without evaluation"
    )
    one = len(config.eval_data) == 1
    return [
        _check_data("eval data" if one else f"eval data {name}", "--eval-data", path, fix.format(name=name, path=path))
        for name, path in config.eval_data.items()
    ]


def _folder_problem(folder: Path) -> str | None:
    """Why the store could not write under ``folder``, found by doing it (mkdir, write a file) and undoing it."""
    missing: list[Path] = []
    existing = folder
    while not existing.exists() and not existing.is_symlink():
        missing.append(existing)
        existing = existing.parent
    if not existing.is_dir():
        what = "a file" if existing.is_file() else "not a folder"
        return f"{existing} is {what}" if existing == folder else f"{existing}, on its path, is {what}"
    created: list[Path] = []
    try:
        for part in reversed(missing):
            doing = f"cannot create {part}"
            try:
                part.mkdir()
            except FileExistsError:
                if part.is_dir():
                    continue  # made meanwhile by someone else: theirs to keep
                raise
            created.append(part)
        doing = f"cannot write a file in {folder}"
        handle, probe = tempfile.mkstemp(prefix=".preflight-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        return f"{doing} ({error.strerror or error})"
    finally:
        for part in reversed(created):
            with contextlib.suppress(OSError):
                part.rmdir()
    return None


def check_episode_dir(config: LauncherConfig, environ: Mapping[str, str]) -> CheckResult:
    """The store warns once in a worker log and saves nothing when it cannot write: refuse it here."""
    name = "episode store folder"
    folder = job_episode_dir(config, environ)
    if folder is None:
        return CheckResult.passed(name, "off (--no-store-episodes)")
    problem = _folder_problem(folder)
    if problem is None:
        return CheckResult.passed(name, f"{folder} is writable")
    given = (
        "--episode-dir" if config.episode_dir else EPISODE_DIR_ENV if environ.get(EPISODE_DIR_ENV, "").strip() else ""
    )
    return CheckResult.failed(
        name,
        f"{given or '<--save-dir>/episodes'} {folder}: {problem}",
        "pass --episode-dir <a folder this user can write> (created if missing), or --no-store-episodes",
    )


def _check_checkpoint(config: LauncherConfig) -> CheckResult:
    name = "torch_dist checkpoint"
    target = config.resolved_ref_load
    tracker = target / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        return CheckResult.passed(name, f"{target} exists")
    if config.skip_prepare:
        return CheckResult.failed(
            name,
            f"{target} holds no converted checkpoint ({tracker.name} missing) and --skip-prepare is set",
            "drop --skip-prepare so the launcher converts --hf-checkpoint, or pass --ref-load <torch_dist dir>",
        )
    return CheckResult.passed(name, f"{target} will be converted from {config.hf_checkpoint}")


def _check_session_port(config: LauncherConfig) -> CheckResult:
    name = "session server port"
    port = config.session_server_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the session server binds (uvicorn)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as error:
            return CheckResult.failed(
                name,
                f"port {port} cannot be bound on this node ({error.strerror or error})",
                "stop what holds it (a previous run's session server?) or pass --session-server-port <free port>",
            )
    return CheckResult.passed(name, f"port {port} is free")


def check_cluster(config: LauncherConfig) -> CheckResult:
    name = "Ray cluster"
    if config.num_nodes > 1 and not config.ray_address:
        return CheckResult.failed(
            name,
            f"--num-nodes {config.num_nodes} needs a running multi-node Ray cluster",
            "start it (`ray start --head --num-gpus N` here, `ray start --address <head>:6379 "
            "--num-gpus N` on each worker) and set RAY_ADDRESS=http://<head>:8265 (or --ray-address)",
        )
    where = config.ray_address or "a local head (reused if running, else started)"
    return CheckResult.passed(name, f"{counted(config.num_nodes, 'node')} via {where}")


_PARSED_PER_ENVIRONMENT = 200
"""Rows of each environment parsed for their tools in a JSONL file; the rest are only counted."""
_PARQUET_WHOLE_BYTES = 32 * 1024 * 1024
"""Parquet files up to this size are read whole; of a larger one, the first ``_PARQUET_ROWS``."""
_PARQUET_ROWS = 2000
_MARK_KEY = b'"' + ENV_KEY.encode() + b'"'
_AGENT_REF = b'"agent_ref"'
_MARK = re.compile(re.escape(_MARK_KEY) + rb'\s*:\s*"([A-Za-z0-9_./-]*)"')
"""The environment mark as JSON writes it (escaped inside a string, e.g. a prompt quoting it)."""


@dataclass
class DataUse:
    """What the data's rows run: every row of a JSONL file, of a parquet file up to ``_PARQUET_WHOLE_BYTES``."""

    sampled: bool = False
    env_rows: Counter[str] = field(default_factory=Counter)
    """Environment (``swe``: NEMO_GYM_URL's rows) -> its rows."""
    tools: dict[str, set[str]] = field(default_factory=dict)
    """Environment -> the names of the function tools its rows give the model."""
    sources: dict[str, list[str]] = field(default_factory=dict)
    """Environment -> the flags whose files have its rows (``--prompt-data``, ``--eval-data NAME``)."""

    def count(self, environment: str, source: str) -> None:
        self.env_rows[environment] += 1
        if environment != SWE_ENVIRONMENT:
            self.tools.setdefault(environment, set())
            if source not in self.sources.setdefault(environment, []):
                self.sources[environment].append(source)

    def add(self, row: Any, source: str) -> bool:
        """Count a parsed row and note the tools it gives the model; False: not a row (no metadata)."""
        metadata = row.get("metadata") if isinstance(row, dict) else None
        if not isinstance(metadata, dict):
            return False
        environment = Task.of(metadata).environment
        self.count(environment, source)
        if environment == SWE_ENVIRONMENT:
            return True
        params = metadata.get("responses_create_params")
        tools = params.get("tools") if isinstance(params, dict) else None
        for tool in tools if isinstance(tools, list) else []:
            function = isinstance(tool, dict) and tool.get("type", "function") == "function"
            if function and isinstance(tool.get("name"), str):
                self.tools[environment].add(tool["name"])
        return True


def _parsed(line: bytes) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def _read_jsonl_use(path: Path, use: DataUse, source: str) -> None:
    """Every line: one without the environment mark is a SWE row; each environment's first rows give its tools."""
    with path.open("rb") as handle:
        for line in handle:
            at = line.find(_MARK_KEY)
            found = _MARK.match(line, at) if at >= 0 else None
            if found is None:
                # No mark, but a NeMo-Gym agent_ref the agent reads its environment from: parsed, each
                # (data the converter wrote carries the mark; only hand-made rows come this way).
                if not (_AGENT_REF in line and use.add(_parsed(line), source)) and line.strip():
                    use.count(SWE_ENVIRONMENT, source)
                continue
            environment = short_name(found.group(1).decode())  # as the agent reads the mark
            if use.env_rows[environment] >= _PARSED_PER_ENVIRONMENT:
                use.count(environment, source)
            else:
                use.add(_parsed(line), source)


def data_use(config: LauncherConfig) -> DataUse | None:
    """What the prompt data and eval sets run, unreadable rows left out; None when no file could be read."""
    use = DataUse()
    read = False
    eval_files = ((f"--eval-data {name}", path) for name, path in config.eval_data.items())
    for source, path in [("--prompt-data", config.prompt_data), *eval_files]:
        try:
            if path.suffix == ".jsonl":
                _read_jsonl_use(path, use, source)
            else:
                rows = iter(open_file(path))
                if path.stat().st_size > _PARQUET_WHOLE_BYTES:
                    rows = itertools.islice(rows, _PARQUET_ROWS)
                    use.sampled = True
                for raw in rows:
                    if raw.data is not None:
                        use.add(raw.data, source)
        except (OSError, MilesNemoGymError):
            continue
        read = True
    return use if read else None


def _check_data_use(use: DataUse) -> CheckResult:
    swe = use.env_rows[SWE_ENVIRONMENT]
    counts = [f"SWE {swe}"] if swe else []
    counts += [f"{name} {count}" for name, count in sorted(use.env_rows.items()) if name != SWE_ENVIRONMENT]
    how = "read (the first rows of a large parquet file)" if use.sampled else "read"
    gym = "" if swe else "; no SWE rows, so NEMO_GYM_URL's server is not checked"
    total = use.env_rows.total()
    return CheckResult.passed("rows' environments", f"{', '.join(counts) or 'no'} rows of {total} {how}{gym}")


def _unnamed_environments(config: LauncherConfig, use: DataUse | None, target: checks.Target) -> list[CheckResult]:
    """A failure for each environment the rows name that NEMO_GYM_ENVS does not."""
    if use is None or not isinstance(target.settings, Settings):
        return []
    return [
        checks.environment_failed(
            name,
            f"rows of {' and '.join(use.sources[name])} are marked {ENV_KEY}={name!r}, which NEMO_GYM_ENVS "
            f"(from {config.envs_origin}) does not name",
            f"and pass --nemo-gym-env {name}=http://<host>:<port> next to the others (or add {name} to NEMO_GYM_ENVS)",
        )
        for name in sorted(set(use.tools) - set(target.settings.environments))
    ]


def plugin_environment(config: LauncherConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The plugin's variables exactly as the job will see them (``job_environment``)."""
    job = job_environment(config, MilesInstall(root=Path(), model_args=()), environ)
    return {name: value for name, value in job.env.items() if name in ENV_VARS}


def run_preflight(
    config: LauncherConfig,
    *,
    environ: Mapping[str, str],
    miles_root: Path | None,
    hook_paths: Sequence[str] | None = None,
    gpu_counter: GpuCounter = _count_gpus,
    fetch: checks.Fetcher = checks.Target.fetch,
) -> list[CheckResult]:
    """Every launcher check, then the NeMo-Gym ones; nothing is started or written."""
    if hook_paths is None:
        hook_paths = [path for _, path in hooks(config)]
    results = [
        _check_legacy_rollout(config, environ),
        _check_miles(miles_root, config),
        _check_megatron(config),
        _check_hooks(hook_paths),
        _check_gpus(config, environ, gpu_counter),
        check_prompt_data(config),
        *_check_eval_data(config),
        check_episode_dir(config, environ),
        _check_checkpoint(config),
        _check_session_port(config),
        check_cluster(config),
    ]
    use = data_use(config)
    if use is not None:
        results.append(_check_data_use(use))
    target = checks.Target.from_env(  # what the job's rollout process will read
        plugin_environment(config, environ),
        config.gym_url_origin,
        session_host=config.session_server_ip,
        fetch=fetch,
        tools=use.tools if use is not None else {},
        tools_not_served=config.tools_not_served,
        gym_server=use is None or use.env_rows[SWE_ENVIRONMENT] > 0,
    )
    gym: list[checks.Wanted] = ["gym answers", "policy field", "policy host"] if target.gym_server else []
    results += checks.run(target, ["settings", *gym])
    results += _unnamed_environments(config, use, target)
    return results + list(checks.run(target, [], environments=True))
