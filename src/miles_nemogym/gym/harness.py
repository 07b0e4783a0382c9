"""The agent CLIs NeMo-Gym's harness agents run, and what ``serve`` changes in their config.

``opencode_agent`` runs the ``opencode`` CLI (npm package ``opencode-ai``, the version its config
pins). ``serve`` installs it once per version into this package's cache (``npm install
--prefix``, no root, no global install) and puts it on the agent's ``PATH``, where the agent's own
setup (``ensure_opencode``) finds it. Its config gets ``model_server: policy_model`` (the agent's
own option: its CLI's provider URL is then the routing model's, with the rollout id) and
OpenCode's title agent disabled (a second conversation on the sample's session). Why:
docs/environments.md, "Harness environments".
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_nemogym.gym import wheel as gym_wheel
from miles_nemogym.gym.venv import GymEnvironmentError, Progress, build_and_publish, build_lock, run_build_step

__all__ = ["HARNESSES", "NOT_RUN_HERE", "Harness", "cli_bin", "cli_need", "harness_layer"]

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
    )
}


def _not_installed(package: str) -> str:
    return (
        f"its CLI (npm `{package}`) is not one serve installs yet: only opencode's `opencode-ai` is "
        "installed, run and tested here"
    )


NOT_RUN_HERE: dict[str, str] = {
    "claude_code_agent": _not_installed("@anthropic-ai/claude-code") + "; its config pins no claude_code_version",
    "codex_agent": _not_installed("@openai/codex"),
    "cline_agent": _not_installed("cline"),
    "kilocode_agent": _not_installed("@kilocode/cli"),
    "openclaw_agent": _not_installed("openclaw"),
    "pi_agent": _not_installed("@earendil-works/pi-coding-agent"),
    "prime_agent": "its CLI installs by a shell script from app.primeintellect.ai (setup_prime_agent.py), "
    "not from npm; serve runs no installer script",
}
"""Harness agents (nemo-gym 0.7.0, their ``setup_*.py``) whose environments ``serve`` refuses, and
why; a harness agent whose own requirements need more than PyPI is refused for that line."""


def harness_layer(kind: str) -> dict[str, Any]:
    """What ``serve`` merges over a ``kind`` agent's block (empty for any other agent)."""
    harness = HARNESSES.get(kind)
    return dict(harness.layer) if harness else {}


def _root() -> Path:
    return gym_wheel.cache_dir() / "npm"


def _cached(harness: Harness, version: str) -> Path | None:
    bin_dir = _root() / f"{harness.package}-{version}" / "node_modules" / ".bin"
    return bin_dir if (bin_dir / harness.command).exists() else None


def cli_need(
    kind: str, block: Mapping[str, Any], which: Callable[[str], str | None] = shutil.which, *, cache: bool = True
) -> str | None:
    """What installing a ``kind`` agent's CLI needs that this host lacks, or None (``cache``: one
    already in this package's cache needs nothing)."""
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
    key = f"{harness.package}-{version}"
    install = [npm, "install", "--prefix", "FOLDER", "--no-audit", "--no-fund", f"{harness.package}@{version}"]
    with build_lock(_root() / f"{key}.lock"):
        if _cached(harness, version) is None:
            progress(f"installing {harness.package}@{version} from npm into {_root()} (once)")
            build_and_publish(
                _root(),
                key,
                lambda folder: run_build_step(
                    [str(folder) if part == "FOLDER" else part for part in install], progress, f"npm-{key}"
                ),
            )
    found = _cached(harness, version)
    if found is None:
        raise GymEnvironmentError(
            f"npm installed {harness.package}@{version} into {_root() / key} but it holds no "
            f"node_modules/.bin/{harness.command}; remove that folder and serve again"
        )
    return found
