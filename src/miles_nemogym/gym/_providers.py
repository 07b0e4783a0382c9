"""What a sandbox provider lacks on this host (``serve --dry-run``), and the config with secrets hidden.
Why: docs/scale-out.md, "Sandboxes".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from miles_nemogym.errors import REDACTED

__all__ = ["missing", "node_binaries", "redacted"]

# The CLI each provider drives (docker, enroot, apptainer: `_require_<name>` in its provider.py).
_BINARIES = {"docker": "docker", "enroot": "enroot", "apptainer": "apptainer"}

_ENV_REFERENCE = re.compile(r"^\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(,.*)?\}$")
_SECRET_KEY = re.compile(
    r"(?:^|_)(?:api_?key|access_key|token|secret|password|authorization|credentials?)$", re.IGNORECASE
)

# Where boto3 finds AWS credentials without a network call (its default chain, minus the
# EC2/ECS metadata endpoints, which only the host itself can reach).
_AWS_CREDENTIAL_VARIABLES = (
    ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    ("AWS_PROFILE",),
    ("AWS_WEB_IDENTITY_TOKEN_FILE",),
    ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",),
    ("AWS_CONTAINER_CREDENTIALS_FULL_URI",),
)

Which = Callable[[str], str | None]


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _leaves(inner, f"{path}.{key}")
    else:
        yield path, value


def _env_value(value: Any, environ: Mapping[str, str]) -> Any:
    """``value`` as the server will see it: an ``${oc.env:NAME[,default]}`` resolved."""
    match = _ENV_REFERENCE.match(value) if isinstance(value, str) else None
    if not match:
        return value
    if environ.get(match.group(1)):
        return environ[match.group(1)]
    default = (match.group(2) or ",").lstrip(",").strip()
    return None if default in ("", "null") else default


def _required_variables(block: dict[str, Any], sandbox: str, environ: Mapping[str, str]) -> list[str]:
    missing = []
    for path, value in _leaves(block, f"sandbox.{sandbox}"):
        match = _ENV_REFERENCE.match(value) if isinstance(value, str) else None
        if match and match.group(2) is None and not environ.get(match.group(1)):
            missing.append(
                f"{match.group(1)} (environment variable read by {path}; or set {path} in --provider-config)"
            )
    return missing


def node_binaries(sandbox: str, config: dict[str, Any]) -> list[str]:
    """The CLI ``sandbox`` runs on whichever node runs an episode (none for SDKs, local, or ``bin_path``)."""
    block = (config.get("sandbox") or {}).get(sandbox) or {}
    name = _BINARIES.get(sandbox)
    return [name] if name and not (sandbox == "apptainer" and block.get("bin_path")) else []


def _binary(sandbox: str, block: dict[str, Any], which: Which) -> list[str]:
    if sandbox == "local":
        shell = str(block.get("shell") or "/bin/bash")
        found = which(shell) if "/" not in shell else (shell if os.access(shell, os.X_OK) else None)
        return [] if found else [f"{shell} (sandbox.local.shell: the shell every command runs in)"]
    name = _BINARIES.get(sandbox)
    if name is None:
        return []
    bin_path = block.get("bin_path") if sandbox == "apptainer" else None
    if bin_path:
        given = Path(str(bin_path)) / name
        return [] if os.access(given, os.X_OK) else [f"{given} (sandbox.apptainer.bin_path names no {name} binary)"]
    path = which(name)
    if path is None:
        return [f"{name} binary on PATH (the {sandbox} provider runs it)"]
    return _docker_daemon(path) if sandbox == "docker" else []


def _docker_daemon(docker: str) -> list[str]:
    """The provider's containers need the daemon, not just the CLI: ask it for its version."""
    try:
        done = subprocess.run(
            [docker, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"a running Docker daemon ({docker} version: {exc})"]
    if done.returncode == 0:
        return []
    said = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return [f"a running Docker daemon ({docker} version: {said[-1] if said else f'exit {done.returncode}'})"]


def _aws_credentials(environ: Mapping[str, str]) -> list[str]:
    if any(all(environ.get(name) for name in names) for names in _AWS_CREDENTIAL_VARIABLES):
        return []
    home = Path(environ.get("HOME") or Path.home())
    files = [
        Path(environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials"),
        Path(environ.get("AWS_CONFIG_FILE") or home / ".aws" / "config"),
    ]
    if any(path.is_file() for path in files):
        return []
    return [
        "AWS credentials (AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or ~/.aws/credentials; "
        "an EC2 instance role also works, which a dry run cannot see)"
    ]


def missing(
    sandbox: str,
    config: dict[str, Any],
    environ: Mapping[str, str] | None = None,
    which: Which = shutil.which,
) -> list[str]:
    """What ``sandbox`` needs on this host that is not there, one line each (never a value)."""
    env = os.environ if environ is None else environ
    block: dict[str, Any] = dict((config.get("sandbox") or {}).get(sandbox) or {})
    found = _binary(sandbox, block, which) + _required_variables(block, sandbox, env)
    if sandbox == "e2b":
        connection = block.get("connection") or {}
        if not (_env_value(connection.get("api_key"), env) or connection.get("api_headers") or env.get("E2B_API_KEY")):
            found.append(
                "E2B_API_KEY (environment variable; or sandbox.e2b.connection.api_key, or connection.api_headers "
                "for a gateway, in --provider-config)"
            )
    if sandbox == "ecs_fargate":
        found += _aws_credentials(env)
    return found


def redacted(value: Any, key: str = "") -> Any:
    """``value`` with every secret-named setting's literal value (not a ``${...}``) replaced by ``***``."""
    if isinstance(value, dict):
        secret_map = key.lower().endswith("headers")
        return {k: (REDACTED if secret_map and v else redacted(v, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(item, key) for item in value]
    interpolation = isinstance(value, str) and value.startswith("${") and value.endswith("}")
    if _SECRET_KEY.search(key) and value not in (None, "") and not interpolation:
        return REDACTED
    return value
