"""Real NeMo-Gym 0.7.0 resources servers, their ``simple_agent`` and its ``vllm_model``.

Started from the cached server venv (the one ``mini_swe_agent_2`` runs in; the
environments used here need nothing more than nemo-gym's own requirements, ``tiktoken``
and ``numpy``, which it has). One config for all of them is composed by nemo-gym's own
parser from each environment's shipped ``configs/<env>.yaml`` plus
``responses_api_models/vllm_model/configs/vllm_model.yaml``; every process gets it in
``NEMO_GYM_CONFIG_DICT`` and its own name in ``NEMO_GYM_CONFIG_PATH``, so servers find
each other without a head server. ``vllm_model`` points at a scripted chat policy.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from miles_nemogym.gym.venv import GymPythonNotFoundError, GymVenv, ensure_gym_venv
from tests.support.ports import free_port

_COMPOSER = """
import json, sys
from omegaconf import OmegaConf
from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
config = GlobalConfigDictParserConfig(
    initial_global_config_dict=OmegaConf.create(json.loads(sys.stdin.read())),
    skip_load_from_cli=True, skip_load_from_dotenv=True, offline=True,
)
print("\\n" + json.dumps({"yaml": OmegaConf.to_yaml(GlobalConfigDictParser().parse(config))}))
"""
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RAY_ADDRESS", "NEMO_GYM_CONFIG_DICT")
MODEL = "policy_model"


class GymEnvironments:
    """``resources_url(env)`` and ``agent_url(env)`` of each started environment."""

    def __init__(self, venv: GymVenv, envs: list[str], policy_v1_url: str, state_dir: Path) -> None:
        self.venv = venv
        self.envs = envs
        self.policy_v1_url = policy_v1_url
        self.state_dir = state_dir
        self._ports: dict[str, int] = {}
        self._agents: dict[str, str] = {}
        self._instances: dict[str, str] = {}
        self._processes: dict[str, subprocess.Popen[bytes]] = {}

    def resources_url(self, env: str) -> str:
        return f"http://127.0.0.1:{self._ports[self._instances[env]]}"

    def agent_url(self, env: str) -> str:
        return f"http://127.0.0.1:{self._ports[self._agents[env]]}"

    def example_rows(self, env: str) -> list[dict[str, Any]]:
        path = self.venv.site_packages / "resources_servers" / env / "data" / "example.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def _config_path(self, env: str) -> Path:
        """The environment's shipped config: ``configs/<env>.yaml``, else its only one."""
        folder = self.venv.site_packages / "resources_servers" / env / "configs"
        named = folder / f"{env}.yaml"
        found = [named] if named.is_file() else sorted(folder.glob("*.yaml"))
        if len(found) != 1:
            raise RuntimeError(f"{env}: expected one config in {folder}, found {found}")
        return found[0]

    def _compose(self) -> str:
        sp = self.venv.site_packages
        payload: dict[str, Any] = {
            "config_paths": [str(self._config_path(e)) for e in self.envs]
            + [str(sp / "responses_api_models/vllm_model/configs/vllm_model.yaml")],
            "policy_base_url": self.policy_v1_url,
            "policy_api_key": "scripted",
            "policy_model_name": "scripted",
        }
        done = subprocess.run(
            [str(self.venv.python), "-c", _COMPOSER],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            cwd=self.state_dir,
            timeout=300,
            check=True,
        )
        return str(json.loads(done.stdout.strip().splitlines()[-1])["yaml"])

    def start(self) -> GymEnvironments:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        config = yaml.safe_load(self._compose())
        # Each environment's resources server instance (named by its config) and simple_agent.
        instances: dict[str, str] = {}
        for name, entry in config.items():
            servers = entry.get("resources_servers") if isinstance(entry, dict) else None
            if isinstance(servers, dict):
                instances.update({env: name for env in servers if env in self.envs})
        for name, entry in config.items():
            agent = (entry.get("responses_api_agents") or {}).get("simple_agent") if isinstance(entry, dict) else None
            if isinstance(agent, dict):
                for env, instance in instances.items():
                    if agent.get("resources_server", {}).get("name") == instance:
                        self._agents.setdefault(env, name)
        self._instances = instances
        where: dict[str, tuple[str, str]] = {instances[e]: ("resources_servers", e) for e in self.envs}
        where.update({agent: ("responses_api_agents", "simple_agent") for agent in self._agents.values()})
        where[MODEL] = ("responses_api_models", "vllm_model")
        for name, (group, kind) in where.items():
            block = config[name][group][kind]
            block["host"], block["port"] = "127.0.0.1", free_port()
            self._ports[name] = block["port"]
        text = yaml.safe_dump(config)
        try:
            for name, (group, kind) in where.items():
                self._spawn(name, self.venv.site_packages / group / kind, text)
            # Starting is import-bound: waiting on all at once takes as long as the slowest.
            for name in where:
                self._wait(name)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, folder: Path, config_yaml: str) -> None:
        tmp = self.state_dir / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env.update(
            {
                "NEMO_GYM_CONFIG_DICT": config_yaml,
                "NEMO_GYM_CONFIG_PATH": name,
                "PYTHONPATH": str(folder),
                "PYTHONUNBUFFERED": "1",
                "TMPDIR": str(tmp),
                "PIP_NO_INDEX": "1",
                "HF_HUB_OFFLINE": "1",
            }
        )
        with (self.state_dir / f"{name}.log").open("ab") as log:
            self._processes[name] = subprocess.Popen(
                [str(self.venv.python), str(folder / "app.py")],
                cwd=self.state_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self, name: str) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.state_dir / f"{name}.log").read_text(errors="replace").splitlines()[-40:])
        return "(no log)"

    def _wait(self, name: str, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self._ports[name]}/openapi.json"
        while True:
            process = self._processes[name]
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited during start:\n{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(url, timeout=5):
                    return
            except urllib.error.HTTPError:
                return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not answer within {timeout:.0f} s:\n{self.log_tail(name)}")
            time.sleep(0.3)

    def stop(self) -> None:
        for process in self._processes.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        self._processes.clear()


@contextlib.contextmanager
def running_environments(envs: list[str], policy_v1_url: str, state_dir: Path) -> Iterator[GymEnvironments]:
    """``envs`` started from the cached server venv (built first if needed), stopped after."""
    try:
        venv = ensure_gym_venv(progress=lambda line: print(f"[gym-venv] {line}", file=sys.__stderr__, flush=True))
    except GymPythonNotFoundError as error:
        pytest.fail(str(error), pytrace=False)
    servers = GymEnvironments(venv, envs, policy_v1_url, state_dir)
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()
