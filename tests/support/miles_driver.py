"""The Miles side of the rollout harness: runs INSIDE the Miles venv, one process per test session.

Started by ``tests.support.miles_harness.MilesDriver`` (never imported by the tests): it
imports Miles once (~40 s), builds the offline Qwen3 tokenizer once, then serves step
requests, one JSON object per line on stdin, answering one JSON line each on the stdout
it was started with (everything Miles prints goes to stderr, i.e. the driver log).

A step is Miles' own rollout, as ``miles/ray/rollout/rollout_manager.py`` runs it at the
pinned commit: Miles' ``parse_args`` -> mock SGLang engine (scripted policy) -> Miles
router -> session server (v1 or v2) -> ``InferenceRolloutFn`` (train or eval) with this
package's hooks -> ``log_rollout_data`` / ``log_eval_rollout_data`` -> (train)
``convert_samples_to_train_data``. The hooks are wrapped in place to record how Miles
called them; Miles' ``tracking.log`` is replaced to record what reached it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import importlib
import inspect
import json
import os
import re
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any
from unittest.mock import patch

# Replies go to the stdout we were started with; anything Miles prints goes to stderr.
_REPLIES = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)


def _install_io_struct_seam() -> None:
    """Stand in for ``sglang.srt.managers.io_struct`` (the one import seam on CPU).

    Miles' ``miles.utils.dumper_utils`` imports SGLang's dumper, which imports
    ``io_struct`` for three socket helpers it never calls on the rollout path; the real
    module imports SGLang's multimodal configs -> transformers image processors ->
    torchvision, which has no CPU wheel matching this torch. Calling a stand-in raises.
    """
    name = "sglang.srt.managers.io_struct"
    module = types.ModuleType(name)

    def _unused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is a test stand-in (torchvision-free); the rollout path never calls it")

    module.sock_recv = module.sock_send = module.wrap_as_pickle = _unused  # type: ignore[attr-defined]
    sys.modules[name] = module


_install_io_struct_seam()

import requests  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from miles.ray.rollout.metrics import log_eval_rollout_data, log_rollout_data  # noqa: E402
from miles.ray.rollout.rollout_data_conversion import postprocess_rollout_data  # noqa: E402
from miles.ray.rollout.train_data_conversion import (  # noqa: E402
    convert_samples_to_train_data,
    split_train_data_by_dp_raw,
)
from miles.rollout.base_types import (  # noqa: E402
    RolloutFnConstructorInput,
    RolloutFnEvalInput,
    RolloutFnTrainInput,
)
from miles.rollout.data_source import RolloutDataSourceWithBuffer  # noqa: E402
from miles.rollout.inference_rollout.compatibility import call_rollout_function, load_rollout_function  # noqa: E402
from miles.rollout.session.server import SessionServer  # noqa: E402
from miles.router.router import MilesRouter  # noqa: E402
from miles.utils.arguments import parse_args  # noqa: E402
from miles.utils.async_utils import get_async_loop, run  # noqa: E402
from miles.utils.http_utils import find_available_port, init_http_client  # noqa: E402
from miles.utils.misc import SingletonMeta, load_function  # noqa: E402
from miles.utils.processing_utils import load_tokenizer  # noqa: E402
from miles.utils.test_utils.mock_sglang_server import MockSGLangServer, ProcessResult, ProcessResultMetaInfo  # noqa: E402
from miles.utils.test_utils.uvicorn_thread_server import UvicornThreadServer  # noqa: E402
from miles.utils.tracking_utils import tracking  # noqa: E402

from miles_nemogym.launcher._command import GENERATE_FUNCTION, HOOKS  # noqa: E402
from miles_nemogym.runtime import install  # noqa: E402
from miles_nemogym.smoke._policy import Script  # noqa: E402
from tests.support.qwen3_tokenizer import TOKENIZER_FORMAT, build_qwen3_tokenizer, qwen_tool_call_text  # noqa: E402

ROLLOUT_FUNCTION = "miles.rollout.inference_rollout.inference_rollout_common.InferenceRolloutFn"
_SCRIPT_TAG = re.compile(r"\[script:([A-Za-z0-9_.-]+)\]")
"""A row's tag naming its scripted completions (``tests/support/scripted_chat.py``'s ``tag``)."""
# ----------------------------------------------------------------------------- recording


class Recorder:
    """What this package's hooks received from Miles, and what reached Miles' tracking."""

    def __init__(self) -> None:
        self.calls: dict[str, list[Any]] = {}
        self.tracking: list[dict[str, Any]] = []

    def add(self, hook: str, entry: Any) -> None:
        self.calls.setdefault(hook, []).append(entry)


RECORDER = Recorder()


def _count(samples: Any) -> int:
    if isinstance(samples, list):
        return sum(_count(s) for s in samples)
    return 1


def _spy(path: str, hook: str) -> None:
    """Replace the function at ``path`` with a wrapper that records each call, then delegates."""
    module_name, _, attr = path.rpartition(".")
    module = importlib.import_module(module_name)
    original = getattr(module, attr)
    original = getattr(original, "__wrapped_original__", original)

    def _entry(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> dict[str, Any]:
        samples = kwargs.get("samples", args[1] if len(args) > 1 else None)
        if hook == "rollout_log":
            samples = args[2] if len(args) > 2 else kwargs.get("samples")
        if hook == "agent":
            return {"metadata_keys": sorted((kwargs.get("metadata") or {}).keys()), "result": _json_safe(result)}
        entry: dict[str, Any] = {"n_samples": _count(samples) if samples is not None else None}
        entry["result"] = _json_safe(getattr(result, "__dict__", result))
        return entry

    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = await original(*args, **kwargs)
            RECORDER.add(hook, _entry(args, kwargs, result))
            return result

    else:

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            result = original(*args, **kwargs)
            RECORDER.add(hook, _entry(args, kwargs, result))
            return result

    wrapper.__wrapped_original__ = original  # type: ignore[attr-defined]
    setattr(module, attr, wrapper)


HOOK_NAMES = {
    "--custom-agent-function-path": "agent",
    "--custom-rm-path": "reward",
    "--dynamic-sampling-filter-path": "dynamic_filter",
    "--custom-rollout-log-function-path": "rollout_log",
    "--custom-eval-rollout-log-function-path": "eval_log",
    "--custom-reward-post-process-path": "reward_post_process",
}


def _record_tracking(args: Any, metrics: dict[str, Any], step_key: str) -> None:
    RECORDER.tracking.append({"step_key": step_key, "metrics": _json_safe(metrics)})


tracking.log = _record_tracking  # no wandb/tensorboard here: record what Miles would send them


# ----------------------------------------------------------------------------- serialising


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=_default))


def _default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "value") and hasattr(value, "name"):  # enums
        return value.value
    if isinstance(value, (set, tuple)):
        return list(value)
    return repr(value)


def sample_json(sample: Any) -> dict[str, Any]:
    return {
        "index": sample.index,
        "group_index": sample.group_index,
        "rollout_id": sample.rollout_id,
        "status": sample.status.value,
        "reward": _json_safe(sample.reward),
        "tokens": len(sample.tokens or []),
        "response_length": sample.response_length,
        "loss_mask": list(sample.loss_mask) if sample.loss_mask is not None else None,
        "rollout_log_probs": len(sample.rollout_log_probs) if sample.rollout_log_probs is not None else None,
        "remove_sample": bool(sample.remove_sample),
        "weight_versions": list(sample.weight_versions),
        "metadata": _json_safe(sample.metadata),
    }


def _nested(value: Any, tokenizer: Any = None) -> Any:
    if isinstance(value, list):
        return [_nested(item, tokenizer) for item in value]
    entry = sample_json(value)
    if tokenizer is not None:
        entry["response_spans"] = response_spans(value, tokenizer)
    return entry


def response_spans(sample: Any, tokenizer: Any) -> list[list[Any]]:
    """The response as ``[loss_mask value, decoded text]`` runs: what trains and what does not."""
    if not sample.response_length or sample.loss_mask is None:
        return []
    tokens = list(sample.tokens)[-sample.response_length :]
    spans: list[list[Any]] = []
    start = 0
    for end in range(1, len(tokens) + 1):
        if end == len(tokens) or sample.loss_mask[end] != sample.loss_mask[start]:
            text = tokenizer.decode(tokens[start:end], skip_special_tokens=False)
            spans.append([int(sample.loss_mask[start]), text])
            start = end
    return spans


# ----------------------------------------------------------------------------- one step


def _trim_stop_token(app: Any, stop: str = "<|im_end|>") -> None:
    """Trim the stop token from a chat completion's message text, as SGLang does.

    Miles' session server asks for ``no_stop_trim: false``: SGLang's message text ends before
    the ``<|im_end|>`` the model stopped at, while its token ids keep it. Miles' mock engine
    returns the policy's text as written, so a final answer (no tool call; the ``qwen25``
    parser already drops what follows a ``</tool_call>``) would keep the stop token in its
    content: the episode's answer would carry it and TITO would count it twice.
    """

    @app.middleware("http")
    async def trim(request: Any, call_next: Any) -> Any:
        response = await call_next(request)
        if request.url.path != "/v1/chat/completions" or response.status_code != 200:
            return response
        body = json.loads(b"".join([chunk async for chunk in response.body_iterator]))
        for choice in body.get("choices") or []:
            message = choice.get("message") or {}
            if isinstance(message.get("content"), str) and message["content"].endswith(stop):
                message["content"] = message["content"][: -len(stop)]
        return JSONResponse(content=body)


def _argv(request: dict[str, Any], tokenizer: Path, data: str, router_port: int) -> list[str]:
    argv = [
        "miles-driver",
        "--train-backend", "fsdp",
        "--ci-test",
        "--rollout-num-gpus", "1",
        "--rollout-num-gpus-per-engine", "1",
        "--hf-checkpoint", str(tokenizer),
        "--prompt-data", data,
        "--input-key", "prompt",
        "--metadata-key", "metadata",
        "--rollout-batch-size", str(request.get("n_prompts", 2)),
        "--n-samples-per-prompt", str(request.get("n_samples", 2)),
        "--num-rollout", str(request.get("drains") or 1),
        # One optimizer step per rollout, as examples/swebench_grpo's launcher sets it.
        "--global-batch-size", str(int(request.get("n_prompts", 2)) * int(request.get("n_samples", 2))),
        "--advantage-estimator", "grpo",
        "--use-miles-router",
        "--sglang-router-ip", "127.0.0.1",
        "--sglang-router-port", str(router_port),
        "--rollout-max-response-len", "1024",
        *(["--fully-async"] if request.get("drains") else ["--rollout-function-path", ROLLOUT_FUNCTION]),
        "--custom-generate-function-path", GENERATE_FUNCTION,
        "--use-session-server", *(["v2"] if request.get("session_server") == "v2" else []),
        "--tito-model", "qwen3",
        "--apply-chat-template-kwargs", '{"enable_thinking": false}',
    ]  # fmt: skip
    for flag, path in HOOKS:
        argv += [flag, path]
    if request.get("mode") == "eval":
        argv += ["--eval-prompt-data", "swe", data, "--n-samples-per-eval-prompt", str(request.get("n_samples", 2))]
    return argv + [str(a) for a in request.get("extra_argv", [])]


def _train_step(args: Any, rollout_id: int, output: Any, decoder: Any, started: float) -> dict[str, Any]:
    """What the trainer gets of one train rollout, as Miles' RolloutManager builds it
    (``miles/ray/rollout/rollout_manager.py``): logged, converted, cut into shards."""
    reply: dict[str, Any] = {"samples": _nested(output.samples, decoder), "metrics": _json_safe(output.metrics)}
    flat, metadata = postprocess_rollout_data(args, output.samples, train_parallel_config=None)
    log_rollout_data(rollout_id, args, flat, output.metrics, time.monotonic() - started)
    post_process = load_function(args.custom_reward_post_process_path)
    train = convert_samples_to_train_data(args, flat, metadata, None, post_process)
    split_train_data_by_dp_raw(args, train, dp_size=1)  # the trainer's shards; sets total_lengths
    keys = ("rewards", "raw_reward", "loss_masks", "response_lengths", "truncated", "rollout_ids")
    keys += ("total_lengths",)
    reply["train_data"] = {key: _json_safe(train.get(key)) for key in keys}
    return reply


def _drains(
    request: dict[str, Any], args: Any, rollout_fn: Any, weight_version: list[int | None], decoder: Any
) -> list[dict[str, Any]]:
    """Miles' fully async rollout as ``train_async.py`` drives it: one train call per step
    (``RolloutFnTrainInput(rollout_id=k, weight_version=k)``, the engine reporting version k
    from then on, as after a weight update), a shared-engine eval after the drains listed in
    ``eval_after``, ``train_s`` of sleep after each (a training step's time). Each call is
    ``call_rollout_function``'s (the coroutine on Miles' background loop) with a time limit, so
    a drain that never completes ends this run, not the driver."""
    limit = float(request.get("drain_limit_s", 60.0))
    out: list[dict[str, Any]] = []
    for k in range(int(request["drains"])):
        weight_version[0] = k
        began = time.monotonic()
        tracked = len(RECORDER.tracking)
        entry: dict[str, Any] = {"rollout_id": k}
        future = asyncio.run_coroutine_threadsafe(
            rollout_fn(RolloutFnTrainInput(rollout_id=k, weight_version=k)), get_async_loop().loop
        )
        try:
            output = future.result(timeout=limit)
            entry["call_s"] = time.monotonic() - began
        except concurrent.futures.TimeoutError:
            future.cancel()
            out.append({**entry, "timed_out": True, "elapsed_s": time.monotonic() - began})
            break
        except Exception as exc:
            entry.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            out.append({**entry, "elapsed_s": time.monotonic() - began})
            break
        entry.update(_train_step(args, k, output, decoder, began))
        if k in (request.get("eval_after") or []):
            evaluated = call_rollout_function(rollout_fn, RolloutFnEvalInput(rollout_id=k))
            entry["eval"] = {name: _nested(result.get("samples") or []) for name, result in evaluated.data.items()}
            log_eval_rollout_data(k, args, evaluated.data, copy.copy(evaluated.metrics))
        entry["tracking"] = RECORDER.tracking[tracked:]
        time.sleep(float(request.get("train_s", 0.0)))  # a stand-in training step: the worker keeps generating
        entry["elapsed_s"] = time.monotonic() - began
        out.append(entry)
    return out


async def _cancel_rollout_tasks() -> None:
    """Cancel every task on Miles' rollout loop but this one (the worker and its groups)."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def run_step(request: dict[str, Any], tokenizer: Path, workdir: Path) -> dict[str, Any]:
    RECORDER.__init__()  # type: ignore[misc]
    # Each step is a fresh run: everything the process keeps across episodes starts clean.
    install()
    script = Script(look_around_turns=int(request.get("look_around_turns", 1)))
    rollout_id = int(request.get("rollout_id", 0))
    policy_calls = [0]
    policy_turns: list[int] = []
    weight_version: list[int | None] = [None]  # fully async: the version the engine reports, raised at each drain

    # Raw completion texts per turn for prompts tagged [script:<name>]; other prompts get the SWE script.
    scripted: dict[str, list[str]] = request.get("scripts") or {}

    def policy(prompt_text: str) -> ProcessResult:
        # The rendered chat ends with the generation prompt; earlier assistant turns are the past.
        turn = max(0, prompt_text.count("<|im_start|>assistant") - 1)
        policy_calls[0] += 1
        policy_turns.append(turn)
        tags = [name for name in _SCRIPT_TAG.findall(prompt_text) if name in scripted]
        if tags:
            texts = scripted[tags[-1]]
            text = texts[min(turn, len(texts) - 1)]
        else:
            text = qwen_tool_call_text(script.command_for_turn(turn), turn)
        meta = ProcessResultMetaInfo(weight_version=None if weight_version[0] is None else str(weight_version[0]))
        return ProcessResult(text=text, finish_reason="stop", meta_info=meta)

    data = request.get("data_file")
    if data is None:
        data = str(workdir / f"data-{time.monotonic_ns()}.jsonl")
        Path(data).write_text("".join(json.dumps(row) + "\n" for row in request["rows"]))

    env = {"NEMO_GYM_URL": request["gym_url"], **request.get("env", {})}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    servers: list[Any] = []
    started = time.monotonic()
    try:
        router_port = find_available_port(20000)
        with patch("sys.argv", _argv(request, tokenizer, data, router_port)):
            args = parse_args()
        init_http_client(args)
        SingletonMeta.clear_all_instances()
        for flag, path in HOOKS:
            _spy(path, HOOK_NAMES[flag])
        # Miles calls a sibling `abort` of the agent function when it aborts a rollout.
        _spy(dict(HOOKS)["--custom-agent-function-path"].rpartition(".")[0] + ".abort", "abort")

        engine = MockSGLangServer(model_name=str(tokenizer), process_fn=policy, host="127.0.0.1", port=0)
        _trim_stop_token(engine.app)
        engine.start()
        servers.append(engine)
        router = UvicornThreadServer(MilesRouter(args, verbose=False).app, host="127.0.0.1", port=router_port)
        router.start()
        servers.append(router)
        requests.post(f"{router.url}/add_worker", params={"url": engine.url}, timeout=10).raise_for_status()
        session_args = copy.copy(args)
        session_port = find_available_port(31000)
        session = UvicornThreadServer(
            SessionServer(session_args, backend_url=router.url).app, host="127.0.0.1", port=session_port
        )
        session.start()
        servers.append(session)
        args.session_server_ip = "127.0.0.1"
        args.session_server_ports = [session_port]

        data_source = RolloutDataSourceWithBuffer(args)
        rollout_fn = load_rollout_function(
            RolloutFnConstructorInput(args=args, data_source=data_source), args.rollout_function_path
        )
        reply: dict[str, Any] = {"finished": True}
        decoder = load_tokenizer(str(tokenizer), trust_remote_code=True) if request.get("response_spans") else None
        if request.get("drains"):
            reply["drains"] = _drains(request, args, rollout_fn, weight_version, decoder)
            reply["rollout_s"] = time.monotonic() - started
        elif request.get("mode") == "eval":
            output = call_rollout_function(rollout_fn, RolloutFnEvalInput(rollout_id=rollout_id))
            reply["rollout_s"] = time.monotonic() - started
            reply["eval"] = {
                name: {
                    "rewards": _json_safe(result.get("rewards")),
                    "truncated": _json_safe(result.get("truncated")),
                    "samples": _nested(result.get("samples") or []),
                }
                for name, result in output.data.items()
            }
            reply["metrics"] = _json_safe(output.metrics)
            log_eval_rollout_data(rollout_id, args, output.data, copy.copy(output.metrics))
        else:
            called = time.monotonic()
            output = call_rollout_function(rollout_fn, RolloutFnTrainInput(rollout_id=rollout_id))
            reply["rollout_call_s"] = time.monotonic() - called
            reply["rollout_s"] = time.monotonic() - started
            reply.update(_train_step(args, rollout_id, output, decoder, started))
        reply["hooks"] = RECORDER.calls
        reply["tracking"] = RECORDER.tracking
        reply["policy_calls"] = policy_calls[0]
        reply["policy_turns"] = policy_turns
        return reply
    finally:
        if request.get("drains"):
            run(_cancel_rollout_tasks())  # Miles' fully async worker lives on its loop: end it with the run
        for server in reversed(servers):
            try:
                server.stop()
            except Exception:
                traceback.print_exc()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main() -> None:
    started = time.monotonic()
    cache = Path(sys.argv[1])
    cache.mkdir(parents=True, exist_ok=True)
    tokenizer = build_qwen3_tokenizer(cache / f"qwen3-tokenizer-v{TOKENIZER_FORMAT}")
    workdir = Path(tempfile.mkdtemp(prefix="miles-driver-"))
    _send({"ready": True, "startup_s": time.monotonic() - started})
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "exit":
            break
        try:
            reply = run_step(request, tokenizer, workdir)
        except BaseException as exc:
            reply = {"finished": True, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            if not isinstance(exc, Exception):
                _send({"id": request.get("id"), **reply})
                raise
        _send({"id": request.get("id"), **reply})


def _send(reply: dict[str, Any]) -> None:
    _REPLIES.write(json.dumps(reply, default=_default) + "\n")
    _REPLIES.flush()


if __name__ == "__main__":
    main()
