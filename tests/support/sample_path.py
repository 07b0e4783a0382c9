"""Which package code one sample runs: a call tracer and the two sample drivers behind
``scripts/sample_path.py`` and ``tests/test_sample_path.py``.

A sample is driven as Miles drives it, over loopback servers only: ``agent.run``, then the
reward hook, the group filter, salvage (only where Miles' ``_post_process_rewards`` imports)
and ``log_rollout`` on its sample, episode store on. ``sys.setprofile`` (and
``threading.setprofile``, for the store's writer thread) sees every Python frame entered;
a frame belongs to the module whose file holds its code, so a callback the event loop runs
is attributed to its own file. A module call edge is a frame of one package module whose
parent frame is in another. Every package module is imported before tracing starts, so
import-time code is not counted.

Each sample is measured in a fresh interpreter (``measure_fresh``): a first sample in a
process runs its one-time work (settings read, pools opened, caches filled) whatever ran
before it, so the figures do not depend on what else the caller did.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ("swe", "environment", "swe-failing", "agent", "buffer")
"""The samples measured: a SWE-bench row through ``/run``, an mcqa row through the ``simple_agent``
loop, the SWE row answered with HTTP 500, a blackjack agent row through its agent's ``/run``, and
the SWE row through the fully async buffer instead of the group filter."""
SWE_INSTANCE = "scikit-learn__scikit-learn-14141"
"""The wheel's example row (and real ``/run`` result, resolved) the SWE sample runs."""
ENVIRONMENT = "mcqa"
_SALVAGE_MODULE = "miles.ray.rollout.train_data_conversion"
_REQUEST_KWARGS = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 64}


@dataclass(frozen=True, order=True)
class Function:
    file: str
    """Path under ``src/miles_nemogym/``."""
    name: str
    """Qualified name (``co_qualname``; the plain name before Python 3.11)."""
    line: int

    @property
    def named(self) -> bool:
        """False for a lambda or a comprehension (``<lambda>``, ``<genexpr>``...)."""
        return not self.name.rpartition(".")[2].startswith("<")


@dataclass
class PathMeasurement:
    """What one sample ran of the package."""

    sample: str
    python: str
    salvage: str
    """``ran``, or why the salvage hook was left out."""
    functions: list[Function] = field(default_factory=list)
    calls: list[tuple[Function, Function]] = field(default_factory=list)
    """(caller, callee) of every call from one package module into another."""
    longest_chain: list[str] = field(default_factory=list)
    """The longest chain of module calls seen on one stack, outermost first."""

    @property
    def files(self) -> list[str]:
        return sorted({function.file for function in self.functions})

    @property
    def named_functions(self) -> int:
        return sum(1 for function in self.functions if function.named)

    @property
    def edges(self) -> list[tuple[str, str]]:
        """(caller module, callee module), modules named by their path without ``.py``."""
        return sorted({(module_name(a.file), module_name(b.file)) for a, b in self.calls})

    def calls_between(self, caller: str, callee: str) -> list[str]:
        """``caller_function -> callee_function`` of each call from module ``caller`` into ``callee``."""
        return sorted(
            f"{a.name} -> {b.name}"
            for a, b in self.calls
            if (module_name(a.file), module_name(b.file)) == (caller, callee)
        )

    @property
    def both_ways(self) -> list[tuple[str, str]]:
        """Module pairs (in name order) each calling the other."""
        edges = set(self.edges)
        return sorted((a, b) for a, b in edges if a < b and (b, a) in edges)

    def to_json(self) -> dict[str, Any]:
        return {
            "sample": self.sample,
            "python": self.python,
            "salvage": self.salvage,
            "files": self.files,
            "functions_named": self.named_functions,
            "functions_all": len(self.functions),
            "module_call_edges": len(self.edges),
            "longest_chain_depth": len(self.longest_chain),
            "longest_chain": self.longest_chain,
            "both_ways": [list(pair) for pair in self.both_ways],
            "edges": [list(edge) for edge in self.edges],
            "functions": [asdict(function) for function in self.functions],
            "calls": [[asdict(a), asdict(b)] for a, b in self.calls],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PathMeasurement:
        return cls(
            sample=data["sample"],
            python=data["python"],
            salvage=data["salvage"],
            functions=[Function(**function) for function in data["functions"]],
            calls=[(Function(**a), Function(**b)) for a, b in data["calls"]],
            longest_chain=list(data["longest_chain"]),
        )


def module_name(file: str) -> str:
    """``episode/run.py`` -> ``episode/run``."""
    return file.removesuffix(".py")


class Tracer:
    """Records the package's functions entered, module call edges and the longest module chain,
    on this thread and on threads started while it traces."""

    def __init__(self, package_dir: Path) -> None:
        self._package = str(package_dir.resolve()) + os.sep
        self._files: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self.active = False
        self.functions: set[Function] = set()
        self.calls: set[tuple[Function, Function]] = set()
        self.longest_chain: list[str] = []

    def _file(self, filename: str) -> str | None:
        """The package-relative path of a code object's file, or None outside the package."""
        try:
            return self._files[filename]
        except KeyError:
            real = os.path.realpath(filename)
            relative = real[len(self._package) :].replace(os.sep, "/") if real.startswith(self._package) else None
            self._files[filename] = relative
            return relative

    def _profile(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call" or not self.active:
            return
        code = frame.f_code
        file = self._file(code.co_filename)
        if file is None or code.co_name == "<module>":
            return
        function = _function(file, code)
        caller: Function | None = None
        chain = [module_name(file)]
        parent = frame.f_back
        while parent is not None:  # up the stack while its frames are the package's
            parent_file = self._file(parent.f_code.co_filename)
            if parent_file is None:
                break
            if caller is None:
                caller = _function(parent_file, parent.f_code)
            if module_name(parent_file) != chain[-1]:
                chain.append(module_name(parent_file))
            parent = parent.f_back
        chain.reverse()
        with self._lock:
            self.functions.add(function)
            if caller is not None and caller.file != file:
                self.calls.add((caller, function))
            longest = self.longest_chain
            if len(chain) > len(longest) or (len(chain) == len(longest) and chain < longest):
                self.longest_chain = chain

    @contextmanager
    def tracing(self) -> Iterator[None]:
        """Trace this thread (and threads it starts) for the block; threads started inside
        keep being traced until ``active`` is set False."""
        self.active = True
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        try:
            yield
        finally:
            sys.setprofile(None)
            threading.setprofile(None)

    def measurement(self, sample: str, salvage: str) -> PathMeasurement:
        with self._lock:
            return PathMeasurement(
                sample=sample,
                python=f"{sys.version_info.major}.{sys.version_info.minor}",
                salvage=salvage,
                functions=sorted(self.functions),
                calls=sorted(self.calls),
                longest_chain=list(self.longest_chain),
            )


def _function(file: str, code: types.CodeType) -> Function:
    return Function(file, getattr(code, "co_qualname", code.co_name), code.co_firstlineno)


def import_package() -> Path:
    """Import every module of the package (so import-time code runs before tracing); its folder."""
    import miles_nemogym

    for module in pkgutil.walk_packages(miles_nemogym.__path__, "miles_nemogym."):
        importlib.import_module(module.name)
    return Path(miles_nemogym.__file__).resolve().parent


def _salvage_available() -> str:
    try:
        importlib.import_module(_SALVAGE_MODULE)
    except ImportError as error:
        return f"skipped (Miles is not importable: {error})"
    return "ran"


class _Args:
    """The Miles arguments the hooks read, as the launcher sets them (one sample per prompt)."""

    n_samples_per_prompt = 1
    custom_reward_post_process_path = "miles_nemogym.groups.reward_post_process"


async def _hooks(
    metadata: dict[str, Any], base_url: str, salvage: bool, *, status: str = "ok", buffered: bool = False
) -> None:
    """``agent.run`` for one row, then the hooks Miles calls on its sample (session server v1:
    the agent's dict merged into ``sample.metadata``, the reward from the reward hook): the group
    filter and salvage, or, ``buffered``, the fully async buffer's ``put``, ``get`` and metrics."""
    from miles_nemogym import agent, groups, metrics
    from miles_nemogym.buffer import EpisodeBuffer
    from tests.support.samples import BufferArgs, BufferConstructor, BufferEntry, Sample

    result = await agent.run(base_url=base_url, prompt=None, request_kwargs=dict(_REQUEST_KWARGS), metadata=metadata)
    sample = Sample(
        metadata={**metadata, **result}, group_index=0, index=0, tokens=[1, 2, 3], response_length=1, loss_mask=[1]
    )
    value = await agent.reward_func(_Args(), sample)
    assert isinstance(value, float)
    sample.reward = value
    if buffered:
        episodes = EpisodeBuffer(BufferConstructor(BufferArgs(n_samples_per_prompt=1), lambda group: None))
        await episodes.put(BufferEntry([sample], [sample]))
        await episodes.get(current_version=None)
        episodes.get_metrics()
    else:
        groups.check_episode_group(_Args(), [sample])
        if salvage:
            groups.reward_post_process(_Args(), [sample])
    metrics.log_rollout(0, _Args(), [sample])
    if result["nemogym"]["status"] != status:
        raise RuntimeError(f"the measured episode did not end {status!r}: {result['nemogym']}")


def _swe_metadata() -> dict[str, Any]:
    from miles_nemogym.gym import wheel
    from tests.support.prompt_rows import converter_rows

    rows = converter_rows([row for row in wheel.example_rows() if row["instance_id"] == SWE_INSTANCE])
    return dict(rows[0]["metadata"])


def _environment_metadata() -> dict[str, Any]:
    from miles_nemogym.data._environments import to_environment_row
    from tests.support.environment_rows import shipped_rows
    from tests.support.scripted_chat import tagged

    row = tagged(shipped_rows(ENVIRONMENT)[0], "answer")  # the scripted policy's tag in the prompt
    converted = to_environment_row(row, ENVIRONMENT, f"{ENVIRONMENT}/0")
    assert isinstance(converted, dict), converted
    return dict(converted["metadata"])


async def _measure_swe(tracer: Tracer, salvage: bool, mode: str = "ok", buffered: bool = False) -> None:
    from miles_nemogym.gym import wheel
    from miles_nemogym.transport import close_pools
    from tests.support.fault_server import FaultServer

    metadata = _swe_metadata()
    gym = await FaultServer.of_results(wheel.example_rollouts(), mode=mode).start()
    try:
        os.environ["NEMO_GYM_URL"] = gym.url
        status = "ok" if mode == "ok" else "failed"
        with tracer.tracing():
            await _hooks(
                metadata, "http://127.0.0.1:39999/sessions/sample-1", salvage, status=status, buffered=buffered
            )
        await close_pools()  # before its server stops: an open keep-alive connection would hold the stop
    finally:
        await gym.stop()


async def _measure_agent(tracer: Tracer, salvage: bool) -> None:
    from miles_nemogym.transport import close_pools
    from tests.support.agent_fixtures import AGENT_ROW, ROLLOUT_SECRET, agent_answer
    from tests.support.fault_server import FaultServer

    agent_server = await FaultServer(result={}, respond=agent_answer(reward=1.0, info={"result": "win"})).start()
    try:
        setting = {"blackjack": {"url": "http://127.0.0.1:9", "agent": agent_server.url, "reward_range": [-1, 1]}}
        os.environ["NEMO_GYM_ENVS"] = json.dumps(setting)
        os.environ["NEMO_GYM_ROLLOUT_SECRET"] = ROLLOUT_SECRET
        with tracer.tracing():
            await _hooks(dict(AGENT_ROW), "http://127.0.0.1:39999/sessions/sample-1", salvage)
        await close_pools()
    finally:
        await agent_server.stop()


async def _measure_environment(tracer: Tracer, salvage: bool) -> None:
    from miles_nemogym.transport import close_pools
    from tests.support.fake_resources import fake_resources
    from tests.support.scripted_chat import ScriptedChat, Turn

    metadata = _environment_metadata()
    with ScriptedChat() as chat:
        chat.script("answer", Turn(content="<think>PCR finds the mutation.</think>\\boxed{B}"))
        async with fake_resources(extra={"extracted_answer": "B"}) as resources:
            os.environ["NEMO_GYM_ENVS"] = json.dumps({ENVIRONMENT: resources.url})
            with tracer.tracing():
                await _hooks(metadata, chat.session_url("sample-1"), salvage)
            await close_pools()


def measure(sample: str) -> PathMeasurement:
    """Measure ``sample`` (one of ``SAMPLES``) in this process; meant for a fresh interpreter
    (``measure_fresh``). Sets ``NEMO_GYM_*`` variables of its own."""
    if sample not in SAMPLES:
        raise ValueError(f"sample must be one of {', '.join(SAMPLES)}, got {sample!r}")
    package_dir = import_package()
    from miles_nemogym.runtime import current
    from miles_nemogym.transport import close_pools

    salvage = _salvage_available()
    tracer = Tracer(package_dir)
    drivers = {
        "swe": _measure_swe,
        "environment": _measure_environment,
        "swe-failing": lambda tracer, salvage: _measure_swe(tracer, salvage, mode="500"),
        "agent": _measure_agent,
        "buffer": lambda tracer, salvage: _measure_swe(tracer, salvage, buffered=True),
    }
    driver = drivers[sample]
    with tempfile.TemporaryDirectory(prefix="sample-path-") as episodes:
        for name in [name for name in os.environ if name.startswith("NEMO_GYM_")]:
            del os.environ[name]
        os.environ["NEMO_GYM_EPISODE_DIR"] = episodes

        async def main() -> None:
            try:
                await driver(tracer, salvage == "ran")
            finally:
                await close_pools()

        asyncio.run(main())
        # The writer thread is still traced: let it finish the sealed step, then stop recording.
        current().stores.get(episodes).flush()
        tracer.active = False
        current().stores.close()
    return tracer.measurement(sample, salvage)


# ----------------------------------------------------------------------------- Markdown

LABELS = {
    "swe": "SWE (`/run`)",
    "environment": f"environment ({ENVIRONMENT})",
    "swe-failing": "SWE, HTTP 500",
    "agent": "agent row (blackjack)",
    "buffer": "SWE, fully async buffer",
}
"""Each sample's name in the tables (docs/architecture.md's rows)."""
SUMMARY_HEADER = (
    "sample",
    "files",
    "functions (named)",
    "functions (all, Python {python})",
    "module call edges",
    "longest module call chain",
    "module pairs calling both ways",
)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join([_row(header), _row(["---"] * len(header)), *(_row(row) for row in rows)])


def chain_text(chain: list[str]) -> str:
    return " → ".join(chain)


def pair_text(pair: tuple[str, str]) -> str:
    return f"{pair[0]} ⇄ {pair[1]}"


def summary_table(measurements: list[PathMeasurement]) -> str:
    """One row per sample: the figures docs/architecture.md states."""
    python = measurements[0].python
    rows = []
    for m in measurements:
        pairs = ", ".join(f"`{pair_text(pair)}`" for pair in m.both_ways)
        rows.append(
            [
                LABELS[m.sample],
                str(len(m.files)),
                str(m.named_functions),
                str(len(m.functions)),
                str(len(m.edges)),
                f"{len(m.longest_chain)} (`{chain_text(m.longest_chain)}`)",
                f"{len(m.both_ways)}" + (f" ({pairs})" if pairs else ""),
            ]
        )
    return _table([cell.format(python=python) for cell in SUMMARY_HEADER], rows)


def files_table(measurements: list[PathMeasurement]) -> str:
    """One row per file any sample ran: its named functions that ran, per sample (— for none)."""
    files = sorted({file for m in measurements for file in m.files})
    rows = []
    for file in files:
        counts = [sum(1 for f in m.functions if f.file == file and f.named) for m in measurements]
        all_counts = [sum(1 for f in m.functions if f.file == file) for m in measurements]
        rows.append([f"`{file}`", *(str(n) if total else "—" for n, total in zip(counts, all_counts, strict=True))])
    return _table(["file (named functions run)", *(LABELS[m.sample] for m in measurements)], rows)


def calls_table(measurement: PathMeasurement) -> str:
    """One sample's module call edges, each with the calls behind it."""
    rows = [
        [f"`{a}`", f"`{b}`", "<br>".join(f"`{call}`" for call in measurement.calls_between(a, b))]
        for a, b in measurement.edges
    ]
    return _table(["caller", "callee", "calls (caller function -> callee function)"], rows)


def markdown(measurements: list[PathMeasurement]) -> str:
    """The report ``scripts/sample_path.py`` prints."""
    lines = [
        "# One sample's path, measured",
        "",
        f"Python {measurements[0].python}; salvage hook (`groups.reward_post_process`): {measurements[0].salvage}.",
        "",
        summary_table(measurements),
        "",
        files_table(measurements),
    ]
    for m in measurements:
        lines += ["", f"## {LABELS[m.sample]}: module calls", ""]
        for a, b in m.both_ways:
            lines.append(
                f"Both ways, `{pair_text((a, b))}`: "
                + "; ".join(f"`{call}` ({x} → {y})" for x, y in ((a, b), (b, a)) for call in m.calls_between(x, y))
            )
            lines.append("")
        lines.append(calls_table(m))
    return "\n".join(lines) + "\n"


def measure_fresh(sample: str) -> PathMeasurement:
    """``measure(sample)`` in a new interpreter running this checkout's ``src``."""
    [measurement] = measure_all_fresh([sample])
    return measurement


def measure_all_fresh(samples: Sequence[str]) -> list[PathMeasurement]:
    """:func:`measure_fresh` for each of ``samples``, the interpreters running side by side (each
    has its own loopback servers, ports and episode folder)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("NEMO_GYM_") and name != "MILES_ROUTER_EXTERNAL_HOST"
    }
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    with tempfile.TemporaryDirectory(prefix="sample-path-out-") as folder:
        started = []
        try:
            for sample in samples:
                # Its output to files: a pipe a side-by-side process fills while its sibling is read would stall it.
                out, err = Path(folder, f"{sample}.out"), Path(folder, f"{sample}.err")
                with out.open("w") as stdout, err.open("w") as stderr:
                    command = [sys.executable, "-m", "tests.support.sample_path", sample]
                    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, text=True)
                started.append((sample, process, out, err))
            measurements = []
            deadline = time.monotonic() + 120 * len(samples)  # side by side on a busy machine: the serial budget
            for sample, process, out, err in started:
                returncode = process.wait(timeout=max(deadline - time.monotonic(), 1))
                if returncode != 0:
                    raise RuntimeError(
                        f"measuring the {sample} sample failed (exit {returncode}):\n{err.read_text()[-4000:]}"
                    )
                measurements.append(PathMeasurement.from_json(json.loads(out.read_text().splitlines()[-1])))
            return measurements
        finally:
            for _, process, _, _ in started:
                if process.poll() is None:
                    process.kill()
                    process.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Measure one sample's path in this process; prints JSON.")
    parser.add_argument("sample", choices=SAMPLES)
    print(json.dumps(measure(parser.parse_args().sample).to_json()))
