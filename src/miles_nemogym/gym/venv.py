"""The NeMo-Gym server's own Python 3.13 virtual environment, built once and cached."""

from __future__ import annotations

import email.parser
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, TypeVar

from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.gym import wheel as gym_wheel
from miles_nemogym.pins import GYM_PYTHON, MINI_SWE_AGENT_VERSION, NEMO_GYM_VERSION, SWEBENCH_VERSION

__all__ = ["GymEnvironmentError", "ensure_gym_venv"]

GYM_PYTHON_ENV = "MILES_NEMOGYM_GYM_PYTHON"
"""Names the Python 3.13 interpreter explicitly (skips the search)."""

_RECIPE_REVISION = 2
"""Bumped when the build recipe changes, so old cached venvs are not reused (2: ``patch_gym``)."""

READY_MARKER = "miles-nemogym-venv.json"
AGENT_RELATIVE_DIR = Path("responses_api_agents") / "mini_swe_agent_2"

# The SDK each provider imports at run time, from nemo-gym's `sandbox` (or `openshell`) extra; the
# other providers drive CLIs or subprocesses.
_PROVIDER_SDKS: dict[str, tuple[str, ...]] = {
    "daytona": ("daytona",),
    "e2b": ("e2b",),
    "opensandbox": ("opensandbox",),
    "openshell": ("openshell",),
    "ecs_fargate": ("boto3",),
}
_SDK_EXTRAS = ("sandbox", "openshell")

# Searched after PATH and pyenv (OS packages, Homebrew).
SYSTEM_DIRS: tuple[str, ...] = ("/usr/local/bin", "/usr/bin", "/opt/homebrew/bin")

Progress = Callable[[str], None]
_T = TypeVar("_T")


class GymEnvironmentError(MilesNemoGymError, RuntimeError):
    """The NeMo-Gym server environment could not be found, built or started."""


class GymPythonNotFoundError(GymEnvironmentError):
    """No working Python 3.13 interpreter on this machine."""


class GymVenvBuildError(GymEnvironmentError):
    """Building the server venv failed (the pip output tail is in the message)."""


@dataclass(frozen=True)
class GymVenv:
    """A ready server venv."""

    path: Path
    python: Path
    site_packages: Path
    built_with: str = ""
    """The Python 3.13 interpreter the venv was created from (empty when unrecorded)."""

    @property
    def agent_dir(self) -> Path:
        """The installed ``mini_swe_agent_2`` server folder (holds ``app.py``)."""
        return self.site_packages / AGENT_RELATIVE_DIR


def _probe(candidate: Path) -> str | None:
    """``None`` when ``candidate`` is a working Python 3.13 with venv support, else why not."""
    code = "import sys, venv, ensurepip; print('%d.%d' % sys.version_info[:2])"
    try:
        done = subprocess.run([str(candidate), "-c", code], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"does not run ({exc.__class__.__name__}: {exc})"
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        return f"exits {done.returncode}: {tail[-1] if tail else 'no output'}"
    version = done.stdout.strip()
    if version != GYM_PYTHON:
        return f"is Python {version}, not {GYM_PYTHON}"
    return None


def gym_python_candidates(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where a Python 3.13 is looked for, in order (without the explicit env var)."""
    env = os.environ if environ is None else environ
    name = f"python{GYM_PYTHON}"
    candidates: list[Path] = []
    on_path = shutil.which(name, path=env.get("PATH", ""))
    if on_path:
        candidates.append(Path(on_path))
    roots = [Path(env["PYENV_ROOT"])] if env.get("PYENV_ROOT") else []
    if env.get("HOME"):
        roots.append(Path(env["HOME"]) / ".pyenv")
    for root in roots:
        found = [p / "bin" / name for p in (root / "versions").glob(f"{GYM_PYTHON}*")]
        # Newest patch release first: "3.13.10" must sort after "3.13.9".
        found.sort(key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.parent.name)], reverse=True)
        candidates.extend(found)
    candidates.extend(Path(d) / name for d in SYSTEM_DIRS)
    return list(dict.fromkeys(path for path in candidates if path.exists()))


def find_gym_python(environ: Mapping[str, str] | None = None) -> Path:
    """A working Python 3.13: ``$MILES_NEMOGYM_GYM_PYTHON``, else the first candidate that runs (shims may not)."""
    env = os.environ if environ is None else environ
    explicit = env.get(GYM_PYTHON_ENV)
    if explicit:
        path = Path(explicit).expanduser()
        problem = _probe(path)
        if problem:
            raise GymPythonNotFoundError(
                f"{GYM_PYTHON_ENV}={explicit} {problem}. Point it at a Python {GYM_PYTHON} "
                f"interpreter that has the venv module, or unset it to search the machine."
            )
        return path
    tried: list[str] = []
    for candidate in gym_python_candidates(env):
        problem = _probe(candidate)
        if problem is None:
            return candidate
        tried.append(f"  {candidate}: {problem}")
    looked = "\n".join(tried) if tried else "  (no python3.13 on PATH, in pyenv or in /usr/bin)"
    raise GymPythonNotFoundError(
        f"NeMo-Gym {NEMO_GYM_VERSION} needs Python {GYM_PYTHON} for its server, and none was found:\n"
        f"{looked}\n"
        f"Install one, e.g. `pyenv install {GYM_PYTHON}`, `uv python install {GYM_PYTHON}`, or your "
        f"OS packages python{GYM_PYTHON} and python{GYM_PYTHON}-venv; or set {GYM_PYTHON_ENV} to its path."
    )


def _requires_dist() -> list[tuple[str, str | None]]:
    """(requirement, extra or None) for every ``Requires-Dist`` of the pinned wheel."""
    member = f"nemo_gym-{NEMO_GYM_VERSION}.dist-info/METADATA"
    # Email-style headers (folded multi-line fields) followed by the README.
    headers = email.parser.HeaderParser().parsestr(gym_wheel.read_member(member).decode("utf-8"))
    found: list[tuple[str, str | None]] = []
    for value in headers.get_all("Requires-Dist") or []:
        requirement = str(value).strip()
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        found.append((requirement, extra.group(1) if extra else None))
    return found


def _distribution_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    return (match.group(0) if match else requirement).lower().replace("_", "-")


def requirements(sandbox: str = "local") -> list[str]:
    """Everything installed before nemo-gym itself (which goes in with ``--no-deps``), ``sandbox``'s SDK last."""
    declared = _requires_dist()
    wanted = set(_PROVIDER_SDKS.get(sandbox, ()))
    specs = [
        req.split(";", 1)[0].strip()
        for req, extra in declared
        if extra in _SDK_EXTRAS and _distribution_name(req) in wanted
    ]
    if len(specs) != len(wanted):
        raise GymEnvironmentError(
            f"nemo-gym {NEMO_GYM_VERSION}'s `sandbox` extra does not list {sorted(wanted)} "
            f"for provider {sandbox!r}; this package's _PROVIDER_SDKS table is out of date."
        )
    base = [req for req, extra in declared if extra is None]
    pinned = [
        f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}",
        f"swebench=={SWEBENCH_VERSION}",
        # Imported by the sandbox layer on every provider, but listed only in an extra.
        "tenacity>=9.1.4",
    ]
    return base + pinned + specs


def venv_key(sandbox: str = "local") -> str:
    """The cache folder name: every pinned version and the provider SDKs it carries."""
    key = (
        f"py{GYM_PYTHON}-nemo-gym{NEMO_GYM_VERSION}-mini-swe-agent{MINI_SWE_AGENT_VERSION}"
        f"-swebench{SWEBENCH_VERSION}-r{_RECIPE_REVISION}"
    )
    sdks = _PROVIDER_SDKS.get(sandbox)
    return key + ("+" + "+".join(sdks) if sdks else "")


def gym_venv_root() -> Path:
    return gym_wheel.cache_dir() / "gym-venv"


PATCHED_FILE = AGENT_RELATIVE_DIR / "app.py"

# Concurrent runs of one instance share (and truncate) this config file: docs/upstream.md, "Patched".
_CONFIG_WRITE = """\
                config_path = config_output_dir / f"{instance_id}.sandbox.yaml"
                config_path.write_text(yaml.safe_dump(config, sort_keys=False))
"""
_CONFIG_WRITE_PATCHED = """\
                # One file per distinct config, written aside and renamed into place: a concurrent
                # run of this instance never reads a partial config, nor one made for another run.
                config_text = yaml.safe_dump(config, sort_keys=False)
                config_digest = hashlib.sha256(config_text.encode()).hexdigest()[:16]
                config_path = config_output_dir / f"{instance_id}.{config_digest}.sandbox.yaml"
                staged_path = config_output_dir / f".{config_path.name}.{uuid4().hex}"
                staged_path.write_text(config_text)
                os.replace(staged_path, config_path)
"""


def patch_gym(site_packages: Path) -> None:
    """Apply this package's fix to the installed nemo-gym (docs/upstream.md, "Patched"); refuses other text."""
    app = site_packages / PATCHED_FILE
    text = app.read_text(encoding="utf-8")
    if text.count(_CONFIG_WRITE) != 1:
        raise GymVenvBuildError(
            f"{app} does not hold the config write this package patches in nemo-gym {NEMO_GYM_VERSION} "
            f"(found {text.count(_CONFIG_WRITE)} times, expected once); the patch in "
            f"miles_nemogym.gym.venv must be redone for this nemo-gym, or dropped if upstream fixed it"
        )
    staged = app.with_name(f".{app.name}.patching")
    staged.write_text(text.replace(_CONFIG_WRITE, _CONFIG_WRITE_PATCHED), encoding="utf-8")
    os.replace(staged, app)


def _load_ready(link: Path) -> GymVenv | None:
    try:
        data = json.loads((link / READY_MARKER).read_text())
        venv = GymVenv(
            path=link,
            python=link / "bin" / "python",
            site_packages=link / data["site_packages"],
            built_with=str(data.get("python", "")),
        )
    except (OSError, ValueError, KeyError):
        return None
    if not venv.python.exists() or not (venv.agent_dir / "app.py").is_file():
        return None
    return venv


@contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created with its folder) for the block: one process builds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_NOT_INHERITED = frozenset(
    {
        # The caller's interpreter and Ray would point a child at other packages or another cluster.
        "PYTHONPATH",
        "PYTHONHOME",
        "VIRTUAL_ENV",
        "RAY_ADDRESS",
        # Each server is given its composed config explicitly.
        "NEMO_GYM_CONFIG_DICT",
        # Each key reaches only the one that needs it: the SWE server gets the policy key in the /run body,
        # the judge's model server the judge's key, the routing model the rollout secret (gym/environments.py).
        "NEMO_GYM_POLICY_API_KEY",
        "NEMO_GYM_JUDGE_API_KEY",
        "NEMO_GYM_ROLLOUT_SECRET",
    }
)


def child_environment() -> dict[str, str]:
    """This process's environment as every process started in the server venv gets it (minus ``_NOT_INHERITED``)."""
    return {name: value for name, value in os.environ.items() if name not in _NOT_INHERITED}


def run_in_gym(
    gym: GymVenv,
    code: str,
    argv: Sequence[str] = (),
    *,
    stdin: str | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``argv`` in ``gym``'s interpreter, output captured; by default from its site-packages
    with :func:`child_environment`, capped at 300 s."""
    return subprocess.run(
        [str(gym.python), "-c", code, *argv],
        input=stdin,
        capture_output=True,
        text=True,
        env=child_environment() if env is None else dict(env),
        cwd=gym.site_packages if cwd is None else cwd,
        timeout=timeout,
        check=False,
    )


def _clean_env() -> dict[str, str]:
    env = child_environment()
    # A build installs from the index (serve's servers get PIP_NO_INDEX=1), into its own venv.
    for name in ("PIP_NO_INDEX", "PIP_REQUIRE_VIRTUALENV"):
        env.pop(name, None)
    return env


class _PipCount:
    """pip's output as counts for the progress line: requirements collected, then the install."""

    def __init__(self, command: Sequence[str]) -> None:
        words = list(command)
        self._pip = "install" in words
        named = words[words.index("install") + 1 :] if self._pip else []
        self._wanted = {_distribution_name(word) for word in named if not word.startswith("-")}
        self._collected: set[str] = set()
        self._text: str | None = None

    def feed(self, line: str) -> str | None:
        """The count after ``line``; None while pip has said nothing countable (or not pip)."""
        if not self._pip:
            return None
        word, _, rest = line.strip().partition(" ")
        if word == "Collecting":
            self._collected.add(_distribution_name(rest))
            self._text = f"{self._resolving()}: {_distribution_name(rest)}"
        elif word == "Downloading" and self._text is not None:
            self._text = f"{self._resolving()}: downloading {rest.rpartition('/')[2]}"
        elif line.startswith("Installing collected packages:"):
            count = len(line.partition(":")[2].split(","))
            self._text = f"installing {count} packages (pip shows no per-package progress here)"
        elif line.startswith("Successfully installed"):
            self._text = f"installed {len(line.split()) - 2} packages"
        return self._text

    def _resolving(self) -> str:
        named = len(self._wanted & self._collected)
        return f"{named} of {len(self._wanted)} requirements collected, {len(self._collected)} packages in all"


def run_build_step(command: Sequence[str], progress: Progress, what: str, *, log_path: Path | None = None) -> None:
    """Run a build step, its output appended to ``log_path`` and each line to ``progress`` indented (a detail);
    a failure names the log and carries its last lines."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", what).strip("-").lower() or "build"
    log_file = log_path or gym_wheel.cache_dir() / "logs" / f"{slug}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    tail: list[str] = []
    count = _PipCount(command)
    with log_file.open("a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                list(command),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=_clean_env(),
                bufsize=1,
            )
        except OSError as error:  # e.g. the venv an interpreter was asked to create has no bin/python
            raise GymVenvBuildError(f"{what} could not run {command[0]}: {error.strerror or error}") from None
        with proc:
            assert proc.stdout is not None
            for raw in proc.stdout:
                log.write(raw)
                line = raw.rstrip()
                if line:
                    tail = [*tail[-29:], line]
                    progress("  " + (count.feed(line) or line.strip()))
            code = proc.wait()
        log.write(f"[exit {code}]\n")
    if code != 0:
        shown = "\n".join(tail)
        raise GymVenvBuildError(f"{what} failed (exit {code}); full log: {log_file}\nlast lines:\n{shown}")


def _build(python: Path, target: Path, sandbox: str, progress: Progress) -> None:
    key = target.name.partition(".build-")[0]
    log_path = target.parent / f"{key}.build.log"
    log_path.unlink(missing_ok=True)  # one build's log, not every attempt's
    progress(f"note: pip's full log: {log_path}")
    progress(f"creating the venv with {python}")

    def step(command: list[str], what: str) -> None:
        run_build_step(command, progress, what, log_path=log_path)

    step([str(python), "-m", "venv", str(target)], "python -m venv")
    venv_python = target / "bin" / "python"
    pip = [str(venv_python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    reqs = requirements(sandbox)
    progress(f"installing {len(reqs)} requirements of nemo-gym {NEMO_GYM_VERSION} (takes minutes)")
    step([*pip, *reqs], "pip install of nemo-gym's requirements")
    wheel = gym_wheel.wheel_path()
    progress(f"installing {wheel.name}")
    step([*pip, "--no-deps", "--ignore-requires-python", str(wheel)], "pip install of nemo-gym")
    progress("checking that the server imports")
    # Prove the server's imports work before publishing the venv as ready.
    check = (
        "import json, sysconfig, nemo_gym, minisweagent, swebench, ray; "
        "print(json.dumps({'site_packages': sysconfig.get_path('purelib')}))"
    )
    done = subprocess.run(
        [str(venv_python), "-c", check], capture_output=True, text=True, env=_clean_env(), check=False
    )
    if done.returncode != 0:
        raise GymVenvBuildError(f"the built venv cannot import the server: {done.stderr.strip()[-2000:]}")
    site = json.loads(done.stdout.strip().splitlines()[-1])["site_packages"]
    progress("patching nemo-gym (docs/upstream.md)")
    patch_gym(Path(site))
    step([str(venv_python), "-m", "py_compile", str(Path(site) / PATCHED_FILE)], "compiling the patched nemo-gym")
    # Relative, so it holds through the published symlink as well as the build folder.
    marker = {
        "site_packages": os.path.relpath(site, target),
        "python": str(python),
        "nemo_gym": NEMO_GYM_VERSION,
        "mini_swe_agent": MINI_SWE_AGENT_VERSION,
        "swebench": SWEBENCH_VERSION,
        "patched": [PATCHED_FILE.as_posix()],
        "requirements": reqs,
    }
    (target / READY_MARKER).write_text(json.dumps(marker, indent=2))


def _remove_debris(root: Path, key: str) -> None:
    """Unpublished build folders of ``key`` (a crash, or a replaced build)."""
    link = root / key
    current = os.readlink(link) if link.is_symlink() else None
    for path in root.glob(f"{key}.build-*"):
        if path.name != current:
            shutil.rmtree(path, ignore_errors=True)


class BuildLines:
    """A ``Progress`` with no live line: ``[tag] step``, details at most every ``every_s`` (install start/end: all)."""

    def __init__(self, tag: str, stream: TextIO | None = None, every_s: float = 15.0) -> None:
        self._tag, self._stream, self._every_s = tag, stream, every_s
        self._last = float("-inf")

    def __call__(self, line: str) -> None:
        if line.startswith(" "):
            detail = line.strip()
            now = time.monotonic()
            if not detail.startswith(("installing ", "installed ")) and now - self._last < self._every_s:
                return
            self._last = now
            line = "  " + detail
        print(f"[{self._tag}] {line}", file=self._stream or sys.stderr, flush=True)


def build_and_publish(root: Path, key: str, build: Callable[[Path], None]) -> Path:
    """Run ``build`` into a fresh folder under ``root`` (returned), publish it as ``root/key``; hold the key's lock."""
    _remove_debris(root, key)
    build_dir = Path(tempfile.mkdtemp(dir=root, prefix=f"{key}.build-"))
    try:
        build(build_dir)
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise
    link, staged = root / key, root / f"{key}.link-{os.getpid()}"
    staged.unlink(missing_ok=True)
    staged.symlink_to(build_dir.name)
    if link.exists() and not link.is_symlink():
        shutil.rmtree(link)  # an unmarked real folder under our name is debris
    os.replace(staged, link)
    _remove_debris(root, key)
    return build_dir


def cached_gym_venv(sandbox: str = "local") -> GymVenv | None:
    """The server venv for ``sandbox`` when it is built; never builds."""
    return _load_ready(gym_venv_root() / venv_key(sandbox))


def ensure_gym_venv(
    sandbox: str = "local",
    progress: Progress | None = None,
    python: Path | None = None,
) -> GymVenv:
    """The ready server venv for ``sandbox``, built (minutes) on first use; ``python`` overrides the search."""
    report = progress or BuildLines("gym-venv")
    link = gym_venv_root() / venv_key(sandbox)
    ready = _load_ready(link)
    if ready:
        explicit = os.environ.get(GYM_PYTHON_ENV) if python is None else None
        # Checked even when unneeded: a wrong value must not pass today and fail on the next rebuild.
        chosen = find_gym_python() if explicit else None
        if chosen and ready.built_with and Path(ready.built_with).resolve() != chosen.resolve():
            report(
                f"note: the cached server environment was built with {ready.built_with}, not "
                f"{GYM_PYTHON_ENV}={explicit}; remove {ready.path} to rebuild it with that interpreter"
            )
        report(f"using the cached NeMo-Gym server environment {link} (Python: {ready.built_with or 'unrecorded'})")
        return ready

    def build(target: Path) -> None:
        interpreter = python or find_gym_python()
        report("first run: building the NeMo-Gym server environment (2-5 minutes, once)")
        _build(interpreter, target, sandbox, report)

    return build_once(link, _load_ready, build, report, "NeMo-Gym server environment")


def build_once(
    link: Path, ready: Callable[[Path], _T | None], build: Callable[[Path], None], progress: Progress, what: str
) -> _T:
    """``ready(link)`` once ``build`` made it, published as ``link`` under its lock (or another process did)."""
    with build_lock(link.parent / f"{link.name}.lock"):
        found = ready(link)  # another process may have built it while we waited
        if found:
            return found
        started = time.monotonic()
        build_dir = build_and_publish(link.parent, link.name, build)
    found = ready(link)
    if found is None:
        raise GymVenvBuildError(f"the {what} built at {build_dir} is not usable through {link}")
    progress(f"{what} ready (built in {time.monotonic() - started:.0f} s): {link}")
    return found
