"""The launcher: recipe -> preflight -> checkpoint -> Ray -> job -> exit code; side effects behind ``Actions``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, get_args, get_origin

from miles_nemogym import fit
from miles_nemogym.checks import CheckResult, all_passed, report
from miles_nemogym.errors import MilesNemoGymError, redact_url
from miles_nemogym.launcher._checks import locate_miles, run_preflight
from miles_nemogym.launcher._command import (
    EPISODE_DIR_ENV,
    DuplicateFlagError,
    GroupSettingError,
    Job,
    MilesInstall,
    build_job,
    checkpoint_command,
    entrypoint,
    eval_config_document,
    layout_lines,
    render,
)
from miles_nemogym.launcher._config import ENVS_ENV, ConfigError, LauncherConfig, load_config, read_yaml
from miles_nemogym.launcher._families import Parsers, resolve

__all__ = ["main"]

EXIT_OK, _EXIT_JOB_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130  # 2: nothing was started

_FLAGS: dict[str, tuple[str, ...]] = {
    "hf_checkpoint": ("--hf-checkpoint", "--model"),
    # Singular and repeated, as `serve --env NAME` and `convert --env NAME=FILE`.
    "nemo_gym_envs": ("--nemo-gym-env", "--nemo-gym-envs"),
}
"""Fields whose flags are not just ``--field-name``: the first is the one ``--help`` leads with."""
_RETIRED_ENV = (
    "--env is not a launcher flag (everywhere else --env names a NeMo-Gym environment): give a "
    "job environment variable as --extra-env NAME=VALUE, an environment's resources server as "
    "--nemo-gym-env NAME=URL (NAME as `miles-nemogym serve --env NAME` starts it)"
)
_SHELL_SPLIT = ("extra_args", "ray_start_args")
_REPEATED: dict[str, str] = {
    "eval_data": "[NAME=]FILE",
    "nemo_gym_envs": "NAME=URL[,max_steps=N]",
    "tools_not_served": "NAME",
    "extra_env": "NAME=VALUE",
    **dict.fromkeys(_SHELL_SPLIT, "'--flag value ...'"),
}
"""Fields whose flag is given once per item, with the item's form."""

_SECTIONS = {"mode": "run", "hf_checkpoint": "model", "prompt_data": "data", "rollout_gpus_per_engine": "rollout",
             "fully_async": "fully async", "miles_root": "training", "num_nodes": "cluster", "eval_data": "eval",
             "store_episodes": "NeMo-Gym"}  # fmt: skip
"""The first field of each ``--help`` section; the recipe's fields come section by section."""


def _groups() -> dict[str, tuple[str, ...]]:
    groups: dict[str, tuple[str, ...]] = {}
    title = ""
    for name in LauncherConfig.model_fields:
        title = _SECTIONS.get(name, title)
        groups[title] = (*groups.get(title, ()), name)
    return groups


GROUPS = _groups()
"""Each recipe field's section in ``--help``."""

_DESCRIPTION = (
    "GRPO with Miles on NeMo-Gym environments: SWE-bench through mini_swe_agent_2, and resources "
    "servers' environments; synchronous (train.py), or fully async on separate training and rollout GPUs "
    "(--fully-async: train_async.py). Values, later wins: defaults < environment (NEMO_GYM_URL, NEMO_GYM_ENVS, "
    "MILES_ROUTER_EXTERNAL_HOST, RAY_ADDRESS, MASTER_ADDR) < --config "
    "YAML < flags. A flag named as a Miles flag sets that Miles flag."
)


def build_parser() -> argparse.ArgumentParser:
    """One flag per recipe field, plus --config and --dry-run, by section; a flag not typed leaves the YAML's value."""
    parser = argparse.ArgumentParser(
        prog="examples/swebench_grpo/run.py",
        usage="%(prog)s [--config FILE] [--dry-run | --preflight-only] [FLAG VALUE ...]",
        description=_DESCRIPTION,
        argument_default=argparse.SUPPRESS,
    )
    sections = {title: parser.add_argument_group(title) for title in GROUPS}
    section_of = {name: sections[title] for title, names in GROUPS.items() for name in names}
    run = sections["run"]
    run.add_argument("--config", type=Path, metavar="FILE", help="YAML recipe; keys are the flag names below")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the exact command and job environment, then exit 0 (nothing started)",
    )
    for name, field in LauncherConfig.model_fields.items():
        group = section_of[name]
        flags = _FLAGS.get(name, (f"--{name.replace('_', '-')}",))
        help_text = (field.description or "").replace("``", "").replace("%", "%%")  # plain text for argparse
        if field.default_factory is None and field.default not in (None, False, [], {}):
            help_text += f" [default: {field.default}]"
        annotation = field.annotation
        if annotation is bool:
            group.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, help=help_text)
        elif name in _REPEATED:
            repeated = " (shell-split; repeatable)" if name in _SHELL_SPLIT else " (repeatable)"
            group.add_argument(*flags, dest=name, action="append", metavar=_REPEATED[name], help=help_text + repeated)
        else:
            metavar = "{" + ",".join(get_args(annotation)) + "}" if get_origin(annotation) is Literal else "VALUE"
            group.add_argument(*flags, dest=name, metavar=metavar, help=help_text)
    return parser


def parse_cli(argv: Sequence[str]) -> tuple[dict[str, Any], Path | None, bool]:
    """``(field values given on the command line, --config path, --dry-run)``."""
    if any(token.split("=", 1)[0] == "--env" for token in argv):
        raise ConfigError(_RETIRED_ENV)
    namespace = vars(build_parser().parse_args(list(argv)))
    config_path = namespace.pop("config", None)
    dry_run = bool(namespace.pop("dry_run", False))
    for name in (name for name in _SHELL_SPLIT if name in namespace):
        chunks, namespace[name] = namespace[name], []
        for chunk in chunks:
            try:
                namespace[name] += shlex.split(chunk)
            except ValueError as error:  # e.g. "No closing quotation"
                flag = "--" + name.replace("_", "-")
                raise ConfigError(
                    f"{flag} {chunk!r}: cannot split it as shell words ({error}); close the quote, "
                    f"e.g. {flag} '--flag \"a b\"'"
                ) from None
    if "extra_env" in namespace:
        bad = next((item for item in namespace["extra_env"] if item.find("=") < 1), None)
        if bad is not None:
            raise ConfigError(f"--extra-env {bad!r}: expected NAME=VALUE")
        namespace["extra_env"] = dict(item.partition("=")[::2] for item in namespace["extra_env"])
    # "none" on the command line clears an optional value.
    cleared = [name for name, value in namespace.items() if isinstance(value, str) and value.lower() == "none"]
    namespace.update(dict.fromkeys(set(cleared) - {"reasoning_parser"}))
    return namespace, config_path, dry_run


def load(argv: Sequence[str]) -> tuple[LauncherConfig, Parsers, bool]:
    """Recipe and parsers from the command line (and YAML); raises ``ConfigError``."""
    cli_values, config_path, dry_run = parse_cli(argv)
    yaml_values = read_yaml(config_path) if config_path is not None else None
    config = load_config(yaml_values, cli_values)
    overrides = ("model_family", "tito_model", "reasoning_parser", "tool_call_parser")
    parsers = resolve(
        config.hf_checkpoint, **{name.removeprefix("model_"): getattr(config, name) for name in overrides}
    )
    return config, parsers, dry_run


class ModelArgsError(MilesNemoGymError, RuntimeError):
    pass


def load_model_args(miles_root: Path, model_type: str) -> tuple[str, ...]:
    """Megatron model arguments from Miles' ``scripts/models/<type>.py``, via Miles' own loader."""
    loader_path = miles_root / "miles" / "utils" / "external_utils" / "model_args_utils.py"
    spec = importlib.util.spec_from_file_location("_miles_model_args_utils", loader_path)
    if spec is None or spec.loader is None or not loader_path.is_file():
        raise ModelArgsError(f"{loader_path} not found: this Miles checkout is too old or incomplete")
    module = importlib.util.module_from_spec(spec)
    # The loader registers itself under its own name for the model scripts it imports.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        text = module.load_model_args(model_type)
    except Exception as error:
        raise ModelArgsError(
            f"loading scripts/models/{model_type}.py from {miles_root} failed ({type(error).__name__}: {error})"
        ) from None
    return tuple(shlex.split(str(text)))


class Actions(Protocol):
    """What the launcher does to the world; every method may block."""

    def convert_checkpoint(self, argv: list[str], env: Mapping[str, str]) -> int: ...

    def ray_reachable(self, address: str) -> bool: ...

    def start_ray_head(self, config: LauncherConfig) -> None: ...

    def ray_head_exit(self) -> int | None: ...  # of the head start_ray_head started; None while it runs

    def stop_ray_head(self) -> None: ...

    def submit(self, job: Job, address: str, submission_id: str) -> int: ...


class RayActions:
    """The real thing: subprocesses and Ray's job-submission client (``ray[default]``)."""

    _head: subprocess.Popen[bytes] | None = None  # the `ray start --head` this launcher started

    def convert_checkpoint(self, argv: list[str], env: Mapping[str, str]) -> int:
        return subprocess.run(argv, env=dict(env), check=False).returncode

    def ray_reachable(self, address: str) -> bool:
        url = address.rstrip("/") + "/api/version"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=3) as response:
                return bool(response.status == 200)
        except OSError:  # URLError included
            return False

    def start_ray_head(self, config: LauncherConfig) -> None:
        # --block keeps `ray start` in the foreground as the parent of the head's processes,
        # so stopping it stops exactly this head: `ray stop` would stop every Ray on the
        # node, a NeMo-Gym server's own included.
        ray = Path(sys.executable).with_name("ray")  # this interpreter's Ray (its venv may not be on PATH)
        argv = [str(ray) if ray.exists() else "ray", "start", "--head", "--block",
                "--node-ip-address", config.master_addr, "--port", str(config.ray_port),
                "--dashboard-port", str(config.ray_dashboard_port), "--num-gpus", str(config.gpus_per_node),
                "--disable-usage-stats", *config.ray_start_args]  # fmt: skip
        print("+ " + shlex.join(argv), flush=True)
        self._head = subprocess.Popen(argv, env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)

    def ray_head_exit(self) -> int | None:
        return None if self._head is None else self._head.poll()

    def stop_ray_head(self) -> None:
        head, self._head = self._head, None
        if head is None or head.poll() is not None:
            return
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()

    def submit(self, job: Job, address: str, submission_id: str) -> int:
        import asyncio

        from ray.job_submission import JobStatus, JobSubmissionClient

        client = JobSubmissionClient(address)
        # A fresh head answers on its dashboard before its job agent is up, and refuses
        # submissions ("No available agent") for a few seconds: retry only that.
        deadline = time.monotonic() + 120
        while True:
            try:
                client.submit_job(
                    entrypoint=entrypoint(job), runtime_env={"env_vars": job.env}, submission_id=submission_id
                )
                break
            except RuntimeError as error:
                if "No available agent" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(2)
        print(f"submitted Ray job {submission_id} to {redact_url(address)}; streaming its logs", flush=True)

        async def tail() -> None:
            async for chunk in client.tail_job_logs(submission_id):
                sys.stdout.write(chunk)
                sys.stdout.flush()

        try:
            asyncio.run(tail())
            status = client.get_job_status(submission_id)
            while not status.is_terminal():
                time.sleep(2)
                status = client.get_job_status(submission_id)
        except KeyboardInterrupt:
            print(f"\ninterrupted: stopping Ray job {submission_id}", flush=True)
            client.stop_job(submission_id)
            return EXIT_INTERRUPTED
        print(f"Ray job {submission_id}: {status}", flush=True)
        return EXIT_OK if status == JobStatus.SUCCEEDED else _EXIT_JOB_FAILED


def _dry_run(config: LauncherConfig, parsers: Parsers, job: Job, miles: MilesInstall, why: str | None) -> int:
    """Print the command, its environment, layout, servers and store; nothing checked or started."""
    width = fit.terminal_width()

    def wrapped(*lines: str) -> None:
        print("\n".join(fit.wrap(list(lines), width, indent="#     ")))

    print(f"# model family {parsers.family}: --tito-model {parsers.tito_model}")
    if why is not None:
        wrapped(f"# Miles not usable here ({why}): its checkout and model arguments are placeholders")
    print(render(job))
    wrapped(*layout_lines(config))
    print(f"# NeMo-Gym server: {redact_url(config.nemo_gym_url)} (from {config.gym_url_origin})")
    if not config.nemo_gym_envs:
        wrapped(f"# environments: none ({config.envs_origin}): rows run through the server above")
    else:
        lines = [f"# environments (from {config.envs_origin}; the job's {ENVS_ENV} above):"]
        for name, server in config.nemo_gym_envs.items():
            steps = "no max_steps" if server.max_steps is None else f"max_steps {server.max_steps}"
            served = ", tools not served" if name in config.tools_not_served else ""
            lines.append(f"#   {name}: {redact_url(server.url)} ({steps}{served})")
        wrapped(*lines)
    if config.eval_data:
        print("# --eval-config above, decoded (Miles' eval config; its metadata_overrides mark eval episodes):")
        print("#   " + json.dumps(eval_config_document(config), sort_keys=True))
    episode_dir = job.env.get(EPISODE_DIR_ENV)
    store = f"# episode store: {episode_dir} (browse: miles-nemogym episodes {episode_dir})"
    wrapped(store if episode_dir else "# episode store: off")
    if not config.skip_prepare:
        print("# checkpoint conversion when the torch_dist target is missing")
        print(shlex.join(redact_url(word) for word in checkpoint_command(config, miles)))
    print(f"# Ray job submission address: {redact_url(_ray_address(config))}")
    wrapped(
        "# a dry run checks nothing: the same command with --preflight-only instead of --dry-run checks "
        "this machine (Miles, GPUs, data, checkpoint, ports, Ray) and says what to fix"
    )
    return EXIT_OK


def _print_results(results: list[CheckResult]) -> None:
    print("\n".join(report(results, fit.terminal_width())), flush=True)


def _ray_address(config: LauncherConfig) -> str:
    return config.ray_address or f"http://{config.master_addr}:{config.ray_dashboard_port}"


def execute(
    config: LauncherConfig,
    parsers: Parsers,
    *,
    dry_run: bool,
    environ: Mapping[str, str],
    actions: Actions,
    checks: Callable[..., list[CheckResult]] = run_preflight,
    miles_root: Path | None = None,
) -> int:
    """Run the recipe; returns the process exit code."""
    root = miles_root if miles_root is not None else locate_miles(config.miles_root)
    miles = MilesInstall(  # for a dry run without Miles: names what would be filled in
        config.miles_root or Path("<miles checkout>"),
        (f"<arguments of scripts/models/{config.megatron_model_type}.py>",),
    )
    load_error: str | None = "the 'miles' package is not importable"
    try:
        if root is not None:
            miles, load_error = MilesInstall(root, load_model_args(root, config.megatron_model_type)), None
    except ModelArgsError as error:  # preflight names the missing piece with its fix; this is the fallback
        load_error = str(error)
    try:
        job = build_job(config, parsers, miles, environ, cwd=Path.cwd())
    except (DuplicateFlagError, GroupSettingError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if dry_run:
        return _dry_run(config, parsers, job, miles, load_error)

    results: list[CheckResult] = checks(config, environ=environ, miles_root=root)
    _print_results(results)
    if not all_passed(results) or load_error is not None:
        if load_error is not None:
            print(f"error: {load_error}", file=sys.stderr)
        print("preflight failed: nothing was started", file=sys.stderr)
        return EXIT_USAGE
    if config.preflight_only:
        print("preflight passed (--preflight-only: nothing started)", flush=True)
        return EXIT_OK

    if not config.skip_prepare:
        tracker = config.resolved_ref_load / "latest_checkpointed_iteration.txt"
        if tracker.is_file():
            print(f"checkpoint {config.resolved_ref_load} exists; conversion skipped", flush=True)
        else:
            argv = checkpoint_command(config, miles)
            print("+ " + shlex.join(argv), flush=True)
            code = actions.convert_checkpoint(argv, {**environ, "PYTHONPATH": job.env["PYTHONPATH"]})
            if code != 0:
                print(f"error: checkpoint conversion exited {code}", file=sys.stderr)
                return _EXIT_JOB_FAILED

    address = _ray_address(config)
    start_head = not actions.ray_reachable(address)
    if start_head and config.ray_address:
        print(f"error: no Ray cluster answers at {redact_url(address)}; start it or unset RAY_ADDRESS", file=sys.stderr)
        return EXIT_USAGE
    if not start_head and not config.ray_address:
        # Could be a previous run's head, or the Ray of a NeMo-Gym server on this node.
        print(
            f"a Ray cluster already answers at {redact_url(address)}: submitting to it (stop it, or set "
            "RAY_ADDRESS / --ray-dashboard-port to choose another)",
            flush=True,
        )
    if start_head:
        actions.start_ray_head(config)
        # A loaded node has taken over 120 s to bring the dashboard up; a head that dies says so at once.
        deadline = time.monotonic() + 300
        while not actions.ray_reachable(address):
            exit_code = actions.ray_head_exit()
            if exit_code is not None or time.monotonic() > deadline:
                why = f"exited with code {exit_code}" if exit_code is not None else "started"
                print(
                    f"error: the Ray head {why} but {redact_url(address)} does not answer; Ray's logs: "
                    f"{os.environ.get('RAY_TMPDIR', '/tmp/ray')}/session_latest/logs",
                    file=sys.stderr,
                )
                actions.stop_ray_head()
                return _EXIT_JOB_FAILED
            time.sleep(1)
    submission_id = f"miles-nemogym-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        return actions.submit(job, address, submission_id)
    finally:
        if start_head and not config.keep_ray:
            actions.stop_ray_head()


def main(argv: Sequence[str] | None = None, *, actions: Actions | None = None) -> int:
    """Parse the recipe and run it; returns the exit code (2: bad recipe or failed preflight)."""
    try:
        config, parsers, dry_run = load(sys.argv[1:] if argv is None else argv)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return execute(config, parsers, dry_run=dry_run, environ=os.environ, actions=actions or RayActions())
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
