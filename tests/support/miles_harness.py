"""Run Miles' own rollout step (train or eval) with this package's hooks, from a test.

How to use (the ``miles_driver`` fixture in ``tests/integration/conftest.py`` gives one
driver per test session; a step over the real Gym server takes ~20-40 s)::

    result = miles_driver.step(
        gym_url=gym_server.url,          # a NeMo-Gym /run server (real, or tests/support/fault_server.py)
        rows=[convert_row(r) for r in gym_example_rows[:2]],   # --prompt-data rows
        n_prompts=2, n_samples=2,        # --rollout-batch-size, --n-samples-per-prompt
        session_server="v1",             # or "v2" (Miles' --use-session-server v2)
        mode="train",                    # or "eval" (--eval-prompt-data swe <same rows>)
        env={"NEMO_GYM_REWARD_MODE": "partial"},   # NEMO_GYM_* for the agent function
        extra_argv=["--max-seq-len", "4096"],      # any further Miles flags
        look_around_turns=1,             # scripted policy: N harmless commands, then submit
        scripts={"name": [text, ...]},   # prompts tagged [script:name]: these raw completions by turn
        response_spans=False,            # train (each drain too): each sample's response as [loss_mask, text] runs
        rollout_id=0,                    # the step's rollout_id (Miles gives it to the log functions)
        time_limit_s=300,                # past it: result.finished is False, driver restarted
        drains=None,                     # N: Miles' fully async rollout (--fully-async), N drains
        eval_after=(),                   # ... with a shared-engine eval after these drains
        drain_limit_s=60,                # ... a drain past it ends the run (result.drains[-1].finished False)
        train_s=0.0,                     # ... seconds slept after each drain (a stand-in training step)
    )
    result.drains                         # fully async: one result per drain (groups, samples with their
                                          #   weight_versions, metrics, train_data, tracked, error; eval)
    result.finished, result.error         # did Miles' step return; its exception if it raised
    result.groups                         # train: kept groups, each a flat list of sample dicts
    result.raw["samples"]                 # ... as Miles nests them (v2: a list per episode)
    result.samples                        # flat: status, reward, tokens, response_length,
                                          #   loss_mask, rollout_log_probs, remove_sample, metadata
                                          #   (+ response_spans when asked)
    result.eval["swe"]                    # eval: rewards, truncated, samples
    result.metrics                        # the rollout function's own metrics
    result.hook_calls("dynamic_filter")   # how Miles called our hooks: agent, reward,
                                          #   dynamic_filter, rollout_log, eval_log, abort (with results)
    result.tracked("rollout/step")        # what reached Miles' tracking.log, merged per step key
    result.train_data                     # Miles' convert_samples_to_train_data: rewards,
                                          #   raw_reward, loss_masks, response_lengths, ...,
                                          #   total_lengths (from split_train_data_by_dp_raw)

Miles runs in its own venv (``tests.support.miles_env``), in a long-lived
subprocess (``tests/support/miles_driver.py``) because importing Miles takes ~40 s; the
two talk JSON lines over a pipe. The driver's own output goes to ``log_path``.

Session fixtures get their environment through ``env_or_fail(request, "miles-env",
ensure_miles_env)``: a machine that cannot have it (no ``MILES_SRC`` and no GitHub access,
say) gets the reason and the fix once per test session on the terminal, and each test that
needs it one short error. ``parse_with_miles`` runs Miles' own argument parser (with
Megatron-LM's) on ``train.py`` argvs (``tests/support/megatron_args.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.gym import wheel as gym_wheel
from miles_nemogym.gym.venv import GymEnvironmentError
from tests.support.miles_env import MilesEnv, MilesEnvironmentError

DRIVER = Path(__file__).with_name("miles_driver.py")
ARGS_CHECKER = Path(__file__).with_name("megatron_args.py")
STARTUP_LIMIT_S = 600.0

_UNAVAILABLE: set[str] = set()
"""The environments this test session could not have (each said once on the terminal)."""


def say(config: pytest.Config, line: str) -> None:
    """``line`` on the terminal now, even from inside a fixture (pytest captures its output)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print(line, file=sys.stderr, flush=True)


class Terminal:
    """A text stream to the terminal past pytest's capture (``say`` for ``print``), for
    progress a session must show while a fixture builds an environment for minutes."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config

    def write(self, text: str) -> int:
        capture = self._config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            sys.stderr.write(text)
            sys.stderr.flush()
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()


def env_or_fail(request: pytest.FixtureRequest, name: str, build: Callable[[], MilesEnv]) -> MilesEnv:
    """``build()`` for a session fixture. When it fails, the reason and its fix are printed once
    per test session as ``[name] ...`` on the terminal and not tried again; each test that needs
    it fails with one short line pointing there (no traceback, nothing printed twice)."""
    if name not in _UNAVAILABLE:
        try:
            return build()
        except (MilesEnvironmentError, GymEnvironmentError) as exc:
            reason = str(exc)
        _UNAVAILABLE.add(name)
        say(request.config, f"[{name}] unavailable for this test session: {reason}")
    # Raised outside the except block: no "During handling of the above exception" chain.
    raise pytest.fail.Exception(
        f"{name} unavailable: the [{name}] line printed on the terminal says why and how to fix it", pytrace=False
    )


def parse_with_miles(env: MilesEnv, request: dict[str, Any], log_path: Path, time_limit_s: float = 600.0) -> Any:
    """Miles' ``parse_args`` on each case of ``request`` (see ``megatron_args.py``), in the Miles
    venv ``env`` (with Megatron-LM: ``ensure_megatron_env``); its output goes to ``log_path``."""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = env.pythonpath()
    environ.pop("VIRTUAL_ENV", None)
    environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with log_path.open("a") as log:
        done = subprocess.run(
            [str(env.python), str(ARGS_CHECKER)],
            input=json.dumps(request),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=environ,
            timeout=time_limit_s,
            check=False,
        )
    if done.returncode != 0 or not done.stdout.strip():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise MilesDriverError(f"Miles' argument check exited {done.returncode}; its log ({log_path}):\n{tail}")
    return json.loads(done.stdout)


class MilesDriverError(RuntimeError):
    """The driver process could not start or died; its log tail is in the message."""


@dataclass
class StepResult:
    """One Miles rollout step, as the driver reported it (see the module docstring)."""

    finished: bool
    raw: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def error(self) -> str | None:
        return self.raw.get("error")

    @property
    def groups(self) -> list[list[dict[str, Any]]]:
        """Kept groups, each flat (under v2 Miles nests each episode's samples in a list)."""
        return [_flat(group) for group in self.raw.get("samples") or []]

    @property
    def samples(self) -> list[dict[str, Any]]:
        return [sample for group in self.groups for sample in _flat(group)]

    @property
    def eval(self) -> dict[str, Any]:
        return dict(self.raw.get("eval") or {})

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.raw.get("metrics") or {})

    @property
    def train_data(self) -> dict[str, Any]:
        return dict(self.raw.get("train_data") or {})

    @property
    def policy_calls(self) -> int:
        return int(self.raw.get("policy_calls") or 0)

    @property
    def drains(self) -> list[StepResult]:
        """Fully async (``drains=N``): each drain (one train call of Miles' ``FullyAsyncRolloutFn``)
        as a result of its own; a drain past ``drain_limit_s`` is not ``finished`` and the last."""
        return [
            StepResult(finished=not d.get("timed_out"), raw=d, elapsed_s=d["elapsed_s"])
            for d in self.raw.get("drains") or []
        ]

    def hook_calls(self, hook: str) -> list[dict[str, Any]]:
        """Each call Miles made to our hook ``hook`` (agent, reward, dynamic_filter, rollout_log, abort)."""
        return list((self.raw.get("hooks") or {}).get(hook, []))

    def tracked(self, step_key: str) -> dict[str, Any]:
        """Everything logged to Miles' tracking under ``step_key``, merged in call order."""
        merged: dict[str, Any] = {}
        for entry in self.raw.get("tracking") or []:
            if entry["step_key"] == step_key:
                merged.update(entry["metrics"])
        return merged

    def check(self) -> StepResult:
        """``self``, after asserting that Miles' step finished without an exception."""
        assert self.finished, f"Miles' rollout step did not finish within its time limit ({self.elapsed_s:.0f} s)"
        assert self.error is None, f"Miles' rollout step raised: {self.raw.get('traceback') or self.error}"
        return self


def _flat(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, list):
        return [sample for item in value for sample in _flat(item)]
    return [value]


class MilesDriver:
    """A Miles driver subprocess in the Miles venv; restarted after a step that overran."""

    def __init__(self, env: MilesEnv, log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.startup_s: float | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._next_id = 0

    def _start(self) -> None:
        environ = dict(os.environ)
        environ["PYTHONPATH"] = self.env.pythonpath()
        environ.pop("VIRTUAL_ENV", None)
        environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # Its temporary files (the step's data files, multiprocessing's folders) go beside its log,
        # in the test's own folder: a driver ended with SIGKILL leaves nothing in $TMPDIR.
        temp = self.log_path.parent / "tmp"
        temp.mkdir(exist_ok=True)
        environ["TMPDIR"] = str(temp)
        cache = gym_wheel.cache_dir() / "miles-tokenizer"
        log = self.log_path.open("a")
        started = time.monotonic()
        self._proc = subprocess.Popen(
            [str(self.env.python), str(DRIVER), str(cache)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=environ,
            start_new_session=True,  # its servers' threads and Ray die with it
        )
        log.close()
        self._replies = queue.Queue()
        threading.Thread(target=self._read, args=(self._proc, self._replies), daemon=True).start()
        ready = self._wait(STARTUP_LIMIT_S)
        if ready is None or not ready.get("ready"):
            self.close()
            raise MilesDriverError(f"the Miles driver did not start; its log ({self.log_path}):\n{self.log_tail()}")
        self.startup_s = time.monotonic() - started

    @staticmethod
    def _read(proc: subprocess.Popen[str], replies: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            replies.put(line)
        replies.put(None)

    def _wait(self, limit_s: float) -> dict[str, Any] | None:
        try:
            line = self._replies.get(timeout=limit_s)
        except queue.Empty:
            return None
        if line is None:
            raise MilesDriverError(f"the Miles driver exited; its log ({self.log_path}):\n{self.log_tail()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_size(self) -> int:
        """Where the log ends now: ``wait_logged`` looks only past it."""
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def wait_logged(self, text: str, *, after: int, limit_s: float, still: Callable[[], bool]) -> bool:
        """Whether ``text`` appears in the log past offset ``after`` within ``limit_s``, polled while
        ``still()`` holds (e.g. the step's thread is alive)."""
        until = time.monotonic() + limit_s
        while time.monotonic() < until and still():
            try:
                with self.log_path.open("rb") as log:
                    log.seek(after)
                    if text.encode() in log.read():
                        return True
            except FileNotFoundError:
                pass
            time.sleep(0.1)
        return False

    def step(
        self,
        *,
        gym_url: str,
        rows: Sequence[dict[str, Any]] | None = None,
        data_file: Path | None = None,
        n_prompts: int = 2,
        n_samples: int = 2,
        session_server: str = "v1",
        mode: str = "train",
        env: dict[str, str] | None = None,
        extra_argv: Sequence[str] = (),
        look_around_turns: int = 1,
        scripts: Mapping[str, Sequence[str]] | None = None,
        response_spans: bool = False,
        rollout_id: int = 0,
        time_limit_s: float = 300.0,
        drains: int | None = None,
        eval_after: Sequence[int] = (),
        drain_limit_s: float = 60.0,
        train_s: float = 0.0,
    ) -> StepResult:
        """Run one Miles rollout step; see the module docstring."""
        if session_server not in ("v1", "v2") or mode not in ("train", "eval"):
            raise ValueError(f"session_server must be v1|v2 and mode train|eval, got {session_server!r}, {mode!r}")
        if (rows is None) == (data_file is None):
            raise ValueError("give exactly one of rows (written to a JSONL file) or data_file")
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        self._next_id += 1
        request = {
            "id": self._next_id,
            "op": "step",
            "gym_url": gym_url,
            "rows": list(rows) if rows is not None else None,
            "data_file": str(data_file) if data_file is not None else None,
            "n_prompts": n_prompts,
            "n_samples": n_samples,
            "session_server": session_server,
            "mode": mode,
            "env": dict(env or {}),
            "extra_argv": list(extra_argv),
            "look_around_turns": look_around_turns,
            "scripts": {name: list(texts) for name, texts in (scripts or {}).items()},
            "response_spans": response_spans,
            "rollout_id": rollout_id,
            "drains": drains,
            "eval_after": list(eval_after),
            "drain_limit_s": drain_limit_s,
            "train_s": train_s,
        }
        with self.log_path.open("a") as log:
            log.write(f"\n===== step {self._next_id}: {mode} {session_server} over {gym_url}\n")
        started = time.monotonic()
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        reply = self._wait(time_limit_s)
        elapsed = time.monotonic() - started
        if reply is None:
            self.close()  # stuck inside Miles' rollout loop: the next step starts a fresh driver
            return StepResult(finished=False, elapsed_s=elapsed)
        return StepResult(finished=bool(reply.get("finished")), raw=reply, elapsed_s=elapsed)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None and proc.stdin is not None:
            try:
                proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                proc.stdin.flush()
                proc.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers of its session (Ray, threads' children)


def grpo(rewards: list[float]) -> list[float]:
    """GRPO's normalised rewards of one group (centred, unbiased std, Miles' 1e-6)."""
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards)
    return [(r - mean) / (std + 1e-6) for r in rewards]
