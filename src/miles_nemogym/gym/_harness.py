"""The agent CLIs NeMo-Gym's harness agents run, and what ``serve`` changes in their config.
Why: docs/environments.md, "Harness environments".
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_nemogym.gym import wheel as gym_wheel
from miles_nemogym.gym.venv import GymEnvironmentError, Progress, build_and_publish, build_lock, run_build_step

__all__ = ["HARNESSES", "NOT_RUN_HERE", "Harness", "cli_bin", "cli_need"]

_POLICY_MODEL = {"type": "responses_api_models", "name": "policy_model"}


@dataclass(frozen=True)
class Harness:
    """One harness agent kind whose CLI this package installs."""

    kind: str
    package: str
    """Its npm package."""
    command: str
    """The command the package installs (``node_modules/.bin/<command>``)."""
    version_field: str
    """The agent config's field pinning the package version."""
    layer: Mapping[str, Any]
    """What ``serve`` merges over the agent's block."""

    def version(self, block: Mapping[str, Any]) -> str:
        """The pinned version; a config without one is refused (an unpinned CLI is not cached)."""
        value = block.get(self.version_field)
        if not isinstance(value, str) or not value.strip():
            raise GymEnvironmentError(
                f"{self.kind}: its config pins no {self.version_field}; set it to a version of npm's "
                f"{self.package} (e.g. 1.17.11) so serve installs that one"
            )
        return value.strip()


HARNESSES: dict[str, Harness] = {
    "opencode_agent": Harness(
        kind="opencode_agent",
        package="opencode-ai",
        command="opencode",
        version_field="opencode_version",
        layer={"model_server": _POLICY_MODEL, "opencode_config": {"agent": {"title": {"disable": True}}}},
    ),
    "kilocode_agent": Harness(
        kind="kilocode_agent",
        package="@kilocode/cli",
        command="kilo",
        version_field="kilo_version",
        # nemo-gym pins 7.4.15, which npm's registry did not hold (nor 7.5.6's platform binary) where
        # this was proven; 7.7.7 runs kilocode_math end to end (tests/integration/test_harness_cli_agents.py).
        layer={
            "model_server": _POLICY_MODEL,
            "kilo_version": "7.7.7",
            "kilo_config": {"agent": {"title": {"disable": True}}},
        },
    ),
    "cline_agent": Harness(
        kind="cline_agent",
        package="cline",
        command="cline",
        version_field="cline_version",
        # nemo-gym pins 3.0.55, which npm's registry did not hold where this was proven; 3.0.57 runs
        # cline_math end to end (tests/integration/test_harness_cli_agents.py).
        layer={"model_server": _POLICY_MODEL, "cline_version": "3.0.57"},
    ),
}


NOT_RUN_HERE: dict[str, str] = {
    "claude_code_agent": "its CLI (npm `@anthropic-ai/claude-code`) has no pinned version (its config's "
    "claude_code_version is null); serve installs a pinned CLI only",
    "codex_agent": "its CLI (npm `@openai/codex` 0.144.4) sends `include` in every /v1/responses call, which "
    "nemo-gym 0.7.0 cannot turn into the chat completion Miles' session server serves (responses_converter.py)",
    "openclaw_agent": "its CLI (npm `openclaw` 2026.6.11) needs Node.js >= 22.19 (on 20 it exits at start); "
    "serve installs no Node.js and the host it was tried on has Node.js 20",
    "pi_agent": "its CLI (npm `@earendil-works/pi-coding-agent` 0.80.2) does not start: npm resolves its "
    "`@earendil-works/pi-ai` ^0.80.2 to 0.80.10, which lacks the `getOAuthApiKey` it imports",
    "prime_agent": "its CLI installs by a shell script from app.primeintellect.ai (setup_prime_agent.py), "
    "not from npm; serve runs no installer script",
}
"""Harness agents (nemo-gym 0.7.0, their ``setup_*.py``) whose environments ``serve`` refuses, and why."""


def _root() -> Path:
    return gym_wheel.cache_dir() / "npm"


def _key(harness: Harness, version: str) -> str:
    """The cache folder's name: ``opencode-ai-1.17.11``, ``kilocode-cli-7.4.15`` (a scope's ``@``/``/`` dropped)."""
    return f"{harness.package.lstrip('@').replace('/', '-')}-{version}"


def _cached(harness: Harness, version: str) -> Path | None:
    bin_dir = _root() / _key(harness, version) / "node_modules" / ".bin"
    return bin_dir if (bin_dir / harness.command).exists() else None


def cli_need(
    kind: str, block: Mapping[str, Any], which: Callable[[str], str | None] = shutil.which, *, cache: bool = True
) -> str | None:
    """What installing a ``kind`` agent's CLI needs that this host lacks (``cache``: a cached one needs nothing)."""
    harness = HARNESSES.get(kind)
    if harness is None:
        return None
    try:
        version = harness.version(block)
    except GymEnvironmentError as error:
        return str(error)
    if (cache and _cached(harness, version) is not None) or which("npm") is not None:
        return None
    return f"npm and npm's registry, to install {harness.package}@{version} once (Debian: apt-get install nodejs npm)"


def cli_bin(kind: str, block: Mapping[str, Any], progress: Progress) -> Path:
    """The folder holding a ``kind`` agent's CLI, installed from npm into the cache on first use."""
    harness = HARNESSES[kind]
    version = harness.version(block)
    found = _cached(harness, version)
    if found is not None:
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise GymEnvironmentError(
            f"{kind} runs the {harness.command!r} CLI, which serve installs with npm: npm is not on PATH; "
            "install Node.js and npm (Debian: apt-get install nodejs npm), then serve again"
        )
    key = _key(harness, version)

    def install(folder: Path) -> None:
        command = [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", f"{harness.package}@{version}"]
        run_build_step(command, progress, f"npm-{key}")

    with build_lock(_root() / f"{key}.lock"):
        if _cached(harness, version) is None:
            progress(f"installing {harness.package}@{version} from npm into {_root()} (once)")
            build_and_publish(_root(), key, install)
    found = _cached(harness, version)
    if found is None:
        raise GymEnvironmentError(
            f"npm installed {harness.package}@{version} into {_root() / key} but it holds no "
            f"node_modules/.bin/{harness.command}; remove that folder and serve again"
        )
    return found
