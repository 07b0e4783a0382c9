"""Every launcher preflight failure, with its fix. No GPU, Ray or Miles needed:
GPUs are counted by a stand-in ``nvidia-smi`` script on PATH, Miles is a stand-in
checkout, the Gym server a loopback HTTP server."""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from miles_nemogym.checks import CheckResult, Status
from miles_nemogym.data._rows import to_prompt_row
from miles_nemogym.data._schema import validate_instance
from miles_nemogym.launcher import _checks as preflight
from miles_nemogym.launcher._command import HOOKS
from miles_nemogym.launcher._config import LauncherConfig
from tests.support.miles_checkout import MODEL_TYPE, make_miles_checkout
from tests.support.openapi import GymStandIn, openapi_document, resources_document, serving
from tests.support.ports import free_port
from tests.support.prompt_rows import environment_rows
from tests.support.unprivileged import run_python_unprivileged

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/support/clean_env.py


def prompt_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        instance = validate_instance(row)
        assert not isinstance(instance, list), instance
        out.append(to_prompt_row(row, instance, subset="verified", split="test"))
    return out


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def fake_nvidia_smi(folder: Path, script: str) -> dict[str, str]:
    folder.mkdir(exist_ok=True)
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return {"PATH": str(folder)}


def gpus(count: int) -> str:
    return "".join(f"echo {index}\n" for index in range(count))


@pytest.fixture
def good(tmp_path: Path, gym_example_rows: list[dict[str, Any]], gym: GymStandIn) -> dict[str, Any]:
    """A setting where every check passes; each test breaks one thing."""
    miles = make_miles_checkout(tmp_path / "miles")
    megatron = tmp_path / "Megatron-LM"
    megatron.mkdir()
    data = write_jsonl(tmp_path / "train.jsonl", prompt_rows(gym_example_rows))
    port = free_port()
    config = LauncherConfig(
        prompt_data=data,
        megatron_path=megatron,
        base_dir=tmp_path,
        nemo_gym_url=gym.url,
        session_server_port=port,
    )
    environ = fake_nvidia_smi(tmp_path / "bin", gpus(4))
    return {"config": config, "miles": miles, "environ": environ, "tmp": tmp_path, "gym": gym}


def run(setting: Mapping[str, Any], **changes: Any) -> dict[str, CheckResult]:
    config = setting["config"].model_copy(update=changes.pop("config", {}))
    results = preflight.run_preflight(
        config,
        environ=changes.pop("environ", setting["environ"]),
        miles_root=changes.pop("miles_root", setting["miles"]),
        **changes,
    )
    assert len({result.name for result in results}) == len(results)
    return {result.name: result for result in results}


def only_failure(results: dict[str, CheckResult]) -> CheckResult:
    failed = [result for result in results.values() if result.status is not Status.passed]
    assert len(failed) == 1, failed
    (result,) = failed
    assert result.fix, result
    return result


def test_everything_passes_in_the_good_setting(good: dict[str, Any]) -> None:
    results = run(good)
    assert all(result.ok for result in results.values()), [r for r in results.values() if not r.ok]
    assert "4 visible" in results["GPUs"].detail
    # The real hooks of this package import and are callable.
    assert "miles_nemogym.agent.run" in results["rollout hooks"].detail
    assert good["gym"].requests == ["/openapi.json"]
    assert results["settings"].detail == f"NeMo-Gym server {good['gym'].url} (from the recipe)"


@pytest.mark.parametrize("value", ["1", "true"])
def test_legacy_rollout_env_is_refused(good: dict[str, Any], value: str) -> None:
    failure = only_failure(run(good, environ={**good["environ"], preflight.LEGACY_ROLLOUT_ENV: value}))
    assert failure.name == "Miles rollout path"
    assert "unrecognized arguments" in failure.detail
    assert failure.fix is not None and "unset MILES_USE_LEGACY_ROLLOUT_V1" in failure.fix


def test_legacy_rollout_env_zero_is_fine(good: dict[str, Any]) -> None:
    results = run(good, environ={**good["environ"], preflight.LEGACY_ROLLOUT_ENV: "0"})
    assert results["Miles rollout path"].ok


def test_miles_not_importable(good: dict[str, Any]) -> None:
    failure = only_failure(run(good, miles_root=None))
    assert failure.name == "Miles" and "not importable" in failure.detail
    assert failure.fix is not None and "pip install -e" in failure.fix


@pytest.mark.parametrize(
    ("remove", "fix_fragment"),
    [
        ("train.py", "repository checkout"),
        ("miles/rollout/generate_hub/agentic_tool_call.py", "update Miles"),
        (f"scripts/models/{MODEL_TYPE}.py", "--megatron-model-type"),
    ],
)
def test_miles_checkout_incomplete(good: dict[str, Any], remove: str, fix_fragment: str) -> None:
    (good["miles"] / remove).unlink()
    failure = only_failure(run(good))
    assert failure.name == "Miles" and remove.rsplit("/", 1)[-1] in failure.detail
    assert failure.fix is not None and fix_fragment in failure.fix


ASYNC = {"fully_async": True, "actor_gpus_per_node": 2, "rollout_num_gpus": 2}
SYNC_HOOKS = tuple(path for _, path in HOOKS)
"""The synchronous hooks: these tests do not depend on the fully async data buffer module."""


def test_a_fully_async_recipe_passes_on_the_same_setting(good: dict[str, Any]) -> None:
    results = run(good, config=ASYNC, hook_paths=SYNC_HOOKS)
    assert all(result.ok for result in results.values()), [r for r in results.values() if not r.ok]
    assert results["Miles rollout path"].detail == "fully async (FullyAsyncRolloutFn) rollout"


@pytest.mark.parametrize("remove", ["train_async.py", "miles/rollout/fully_async_rollout.py"])
def test_fully_async_needs_miles_async_entry_point_and_rollout(good: dict[str, Any], remove: str) -> None:
    (good["miles"] / remove).unlink()
    failure = only_failure(run(good, config=ASYNC, hook_paths=SYNC_HOOKS))
    assert failure.name == "Miles" and remove.rsplit("/", 1)[-1] in failure.detail
    fix = "repository checkout" if remove == "train_async.py" else "predates the fully async rollout"
    assert failure.fix is not None and fix in failure.fix
    assert run(good)["Miles"].ok  # the synchronous recipe does not need them


def test_legacy_rollout_env_is_refused_naming_fully_async(good: dict[str, Any]) -> None:
    environ = {**good["environ"], preflight.LEGACY_ROLLOUT_ENV: "1"}
    failure = only_failure(run(good, config=ASYNC, hook_paths=SYNC_HOOKS, environ=environ))
    assert "train_async.py would stop" in failure.detail and "--fully-async needs the class-based" in failure.detail
    assert failure.fix is not None and "unset MILES_USE_LEGACY_ROLLOUT_V1" in failure.fix


def test_the_fully_async_data_buffer_is_among_the_hooks_preflight_imports(good: dict[str, Any]) -> None:
    result = run(good, config=ASYNC)["rollout hooks"]
    assert "miles_nemogym.buffer.EpisodeBuffer" in result.detail  # imported, whether or not it is there yet
    assert "miles_nemogym.buffer" not in run(good)["rollout hooks"].detail


def test_megatron_missing(good: dict[str, Any]) -> None:
    failure = only_failure(run(good, config={"megatron_path": good["tmp"] / "nowhere"}))
    assert failure.name == "Megatron-LM"
    assert failure.fix is not None and "--megatron-path" in failure.fix


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("miles_nemogym.no_such_module.run", "importing miles_nemogym.no_such_module failed"),
        ("miles_nemogym.agent.no_such_function", "has no callable 'no_such_function'"),
    ],
)
def test_hook_not_importable(good: dict[str, Any], path: str, fragment: str) -> None:
    failure = only_failure(run(good, hook_paths=("miles_nemogym.agent.run", path)))
    assert failure.name == "rollout hooks" and fragment in failure.detail


def test_too_few_gpus(good: dict[str, Any]) -> None:
    environ = fake_nvidia_smi(good["tmp"] / "bin2", gpus(2))
    failure = only_failure(run(good, environ=environ))
    assert failure.name == "GPUs" and "2 visible" in failure.detail and "needs 4" in failure.detail
    assert failure.fix is not None and "--gpus-per-node" in failure.fix


@pytest.mark.parametrize(
    ("visible", "count"),
    [("0,1,2", 3), ("-1", 0), ("0,1,-1,2,3", 2)],  # CUDA stops at the first invalid entry: -1 hides the rest
)
def test_cuda_visible_devices_limits_the_count(good: dict[str, Any], visible: str, count: int) -> None:
    environ = {**fake_nvidia_smi(good["tmp"] / "bin3", gpus(8)), "CUDA_VISIBLE_DEVICES": visible}
    failure = only_failure(run(good, environ=environ))
    assert f"{count} visible" in failure.detail and f"CUDA_VISIBLE_DEVICES={visible}" in failure.detail


def test_nvidia_smi_failing(good: dict[str, Any]) -> None:
    environ = fake_nvidia_smi(good["tmp"] / "bin4", "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    failure = only_failure(run(good, environ=environ))
    assert "exited 9" in failure.detail and "NVIDIA-SMI has failed" in failure.detail


def test_no_gpu_tooling(good: dict[str, Any]) -> None:
    empty = good["tmp"] / "empty-bin"
    empty.mkdir()
    failure = only_failure(run(good, environ={"PATH": str(empty)}))
    assert "nvidia-smi is not on PATH and torch is not installed" in failure.detail
    assert failure.fix is not None and "GPU node" in failure.fix


def data_failure(good: dict[str, Any], path: Path) -> CheckResult:
    failure = only_failure(run(good, config={"prompt_data": path}))
    assert failure.name == "prompt data"
    assert failure.fix is not None and "miles-nemogym convert" in failure.fix
    return failure


def test_prompt_data_missing(good: dict[str, Any]) -> None:
    assert "does not exist" in data_failure(good, good["tmp"] / "nope.jsonl").detail


def test_prompt_data_wrong_format(good: dict[str, Any]) -> None:
    path = good["tmp"] / "data.json"
    path.write_text("[]")
    assert ".jsonl or .parquet" in data_failure(good, path).detail


def test_prompt_data_bad_json_line(good: dict[str, Any]) -> None:
    path = good["tmp"] / "bad.jsonl"
    path.write_text('{"prompt": []}\n{not json\n')
    detail = data_failure(good, path).detail
    assert "row 2 (line 2): not valid JSON: Expecting property name" in detail


def test_prompt_data_empty(good: dict[str, Any]) -> None:
    path = good["tmp"] / "empty.jsonl"
    path.write_text("\n")
    assert "has no rows" in data_failure(good, path).detail


def test_raw_swebench_rows_are_not_prompt_rows(good: dict[str, Any], gym_example_rows: list[dict[str, Any]]) -> None:
    detail = data_failure(good, write_jsonl(good["tmp"] / "raw.jsonl", gym_example_rows)).detail
    assert "row 1" in detail and "'prompt' must be a non-empty list" in detail


def test_prompt_row_missing_instance_fields(good: dict[str, Any], gym_example_rows: list[dict[str, Any]]) -> None:
    rows = prompt_rows(gym_example_rows)
    del rows[2]["metadata"]["base_commit"]
    rows[2]["metadata"]["FAIL_TO_PASS"] = []
    detail = data_failure(good, write_jsonl(good["tmp"] / "partial.jsonl", rows)).detail
    instance = rows[2]["metadata"]["instance_id"]
    assert f"row 3: instance {instance}" in detail
    assert "metadata.base_commit" in detail and "metadata.FAIL_TO_PASS" in detail


def test_prompt_row_without_metadata(good: dict[str, Any]) -> None:
    path = write_jsonl(good["tmp"] / "nometa.jsonl", [{"prompt": [{"role": "user", "content": "x"}]}])
    assert "'metadata'" in data_failure(good, path).detail


def test_parquet_prompt_data_is_read(good: dict[str, Any], gym_example_rows: list[dict[str, Any]]) -> None:
    path = good["tmp"] / "train.parquet"
    pq.write_table(pa.Table.from_pylist(prompt_rows(gym_example_rows)), path)
    assert run(good, config={"prompt_data": path})["prompt data"].ok


def test_skip_prepare_without_checkpoint(good: dict[str, Any]) -> None:
    failure = only_failure(run(good, config={"skip_prepare": True}))
    assert failure.name == "torch_dist checkpoint" and "--skip-prepare" in failure.detail
    target = good["config"].resolved_ref_load
    target.mkdir(parents=True)
    (target / "latest_checkpointed_iteration.txt").write_text("release")
    assert run(good, config={"skip_prepare": True})["torch_dist checkpoint"].ok


def test_session_port_taken(good: dict[str, Any]) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        failure = only_failure(run(good, config={"session_server_port": port}))
    assert failure.name == "session server port" and str(port) in failure.detail
    assert failure.fix is not None and "--session-server-port" in failure.fix


def test_multi_node_needs_a_cluster(good: dict[str, Any]) -> None:
    failure = only_failure(run(good, config={"num_nodes": 2}))
    assert failure.name == "Ray cluster"
    assert failure.fix is not None and "RAY_ADDRESS" in failure.fix
    assert run(good, config={"num_nodes": 2, "ray_address": "http://head:8265"})["Ray cluster"].ok


def test_gym_checks_use_the_recipe_url_and_restore_the_environment(
    good: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", "http://127.0.0.1:9")  # what the shell had: not the recipe's
    good["gym"].serve(openapi_document(with_policy_field=False))
    failure = only_failure(run(good))
    assert failure.name == "/run accepts policy_base_url"
    assert os.environ["NEMO_GYM_URL"] == "http://127.0.0.1:9"
    assert good["gym"].requests == ["/openapi.json"]


def test_gym_unreachable(good: dict[str, Any]) -> None:
    port = free_port()
    results = run(good, config={"nemo_gym_url": f"http://127.0.0.1:{port}"})
    assert results["NeMo-Gym answers"].status is Status.failed
    assert results["/run accepts policy_base_url"].status is Status.skipped


# --- held-out data and the episode folder -------------------------------------------------


def eval_failure(good: dict[str, Any], path: Path) -> CheckResult:
    failure = only_failure(run(good, config={"eval_data": {"held_out": path}}))
    assert failure.name == "eval data"
    assert failure.detail.startswith(f"--eval-data {path}")
    assert failure.fix is not None and "--holdout-output" in failure.fix and "--eval-data" in failure.fix
    return failure


def test_eval_data_is_checked_like_prompt_data(good: dict[str, Any]) -> None:
    tmp = good["tmp"]
    assert run(good)["eval data"].detail == "no --eval-data: no held-out evaluation"
    assert run(good, config={"eval_data": {"held_out": good["config"].prompt_data}})["eval data"].ok
    assert "does not exist" in eval_failure(good, tmp / "holdout.jsonl").detail
    (tmp / "empty.jsonl").write_bytes(b"")
    assert "has no rows" in eval_failure(good, tmp / "empty.jsonl").detail
    (tmp / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    assert "not valid JSON" in eval_failure(good, tmp / "binary.jsonl").detail
    (tmp / "folder.jsonl").mkdir()
    assert "is a folder, not a file" in eval_failure(good, tmp / "folder.jsonl").detail
    assert "is not a regular file" in eval_failure(good, Path("/dev/null")).detail


def folder_failure(good: dict[str, Any], path: Path, **changes: Any) -> CheckResult:
    failure = only_failure(run(good, config={"episode_dir": path}, **changes))
    assert failure.name == "episode store folder"
    assert failure.fix is not None and "--episode-dir" in failure.fix and "--no-store-episodes" in failure.fix
    return failure


def test_episode_folder_is_created_writable_and_left_as_found(good: dict[str, Any]) -> None:
    default = good["config"].resolved_episode_dir
    assert not default.parent.exists()
    assert run(good)["episode store folder"].detail == f"{default} is writable"
    assert not default.parent.exists()  # the probe removed what it made
    existing = good["tmp"] / "episodes"
    existing.mkdir()
    assert run(good, config={"episode_dir": existing})["episode store folder"].ok
    assert list(existing.iterdir()) == []
    assert run(good, config={"store_episodes": False})["episode store folder"].detail.startswith("off")


def test_episode_folder_that_cannot_be_one_is_refused(good: dict[str, Any]) -> None:
    a_file = good["tmp"] / "a-file"
    a_file.write_text("x")
    assert folder_failure(good, a_file).detail == f"--episode-dir {a_file}: {a_file} is a file"
    under = a_file / "episodes"
    assert folder_failure(good, under).detail == f"--episode-dir {under}: {a_file}, on its path, is a file"
    assert folder_failure(good, Path("/dev/null")).detail == "--episode-dir /dev/null: /dev/null is not a folder"
    # /proc takes no new folders, whoever asks.
    proc = Path("/proc/miles-nemogym-preflight/episodes")
    assert "cannot create /proc/miles-nemogym-preflight" in folder_failure(good, proc).detail


def test_episode_folder_from_the_environment_is_named_as_such(
    good: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    (good["tmp"] / "a-file").write_text("x")
    monkeypatch.chdir(good["tmp"])
    environ = {**good["environ"], "NEMO_GYM_EPISODE_DIR": "a-file"}  # relative: the launcher's folder
    failure = only_failure(run(good, environ=environ))
    assert failure.detail.startswith(f"NEMO_GYM_EPISODE_DIR {good['tmp'] / 'a-file'}: ")


def test_episode_folder_without_write_permission_is_refused(good: dict[str, Any]) -> None:
    read_only = good["tmp"] / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    code = (
        "from pathlib import Path\n"
        "from miles_nemogym.launcher._checks import check_episode_dir\n"
        "from miles_nemogym.launcher._config import LauncherConfig\n"
        "print(check_episode_dir(LauncherConfig(episode_dir=Path('read-only/run1')), {}).detail)\n"
    )
    try:
        done = run_python_unprivileged(code, cwd=good["tmp"])
    finally:
        read_only.chmod(0o755)
    assert done.returncode == 0, done.stderr
    wanted = read_only / "run1"
    assert done.stdout.strip() == f"--episode-dir {wanted}: cannot create {wanted} (Permission denied)"


# --- environments: NEMO_GYM_ENVS, each resources server and the tools its rows use ----------

WA_TOOLS = ("email_send_email", "calendar_create_event")


def with_environments(good: dict[str, Any], rows: list[dict[str, Any]], **fields: Any) -> dict[str, CheckResult]:
    """The good setting's preflight on ``rows``, with ``fields`` given as a recipe gives them."""
    data = write_jsonl(good["tmp"] / "mixed.jsonl", rows)
    given = {**good["config"].model_dump(exclude_unset=True), "prompt_data": data, **fields}
    results = preflight.run_preflight(
        LauncherConfig.model_validate(given), environ=good["environ"], miles_root=good["miles"]
    )
    assert len({result.name for result in results}) == len(results)
    return {result.name: result for result in results}


def env_config(**servers: str) -> dict[str, Any]:
    """``nemo_gym_envs`` as the validated recipe holds it."""
    return LauncherConfig(nemo_gym_envs=servers).nemo_gym_envs


def test_mixed_swe_and_environment_rows_pass_and_each_server_is_checked(
    good: dict[str, Any], gym_example_rows: list[dict[str, Any]]
) -> None:
    rows = prompt_rows(gym_example_rows)[:2] + environment_rows("mcqa", 3) + environment_rows("wa", 2, WA_TOOLS)
    with serving(resources_document()) as mcqa, serving(resources_document(WA_TOOLS)) as wa:
        results = with_environments(good, rows, nemo_gym_envs=env_config(mcqa=mcqa.url, wa=wa.url))
    assert all(result.ok for result in results.values()), [r for r in results.values() if not r.ok]
    assert results["rows' environments"].detail == "SWE 2, mcqa 3, wa 2 rows of 7 read"
    assert results["environment mcqa"].detail == f"{mcqa.url}: POST /seed_session, /verify and the rows' 0 tools"
    assert results["environment wa"].detail == f"{wa.url}: POST /seed_session, /verify and the rows' 2 tools"
    assert mcqa.requests == wa.requests == ["/openapi.json"] * 2  # its routes, then the name it answers with
    assert "NeMo-Gym answers" in results  # SWE rows: the mini_swe_agent_2 server is checked as before
    assert good["gym"].requests == ["/openapi.json"]


def test_an_environment_only_run_does_not_need_the_swe_server(good: dict[str, Any]) -> None:
    rows = environment_rows("mcqa", 2)
    with serving(resources_document()) as mcqa:
        nowhere = f"http://127.0.0.1:{free_port()}"
        results = with_environments(good, rows, nemo_gym_envs=env_config(mcqa=mcqa.url), nemo_gym_url=nowhere)
    assert all(result.ok for result in results.values()), [r for r in results.values() if not r.ok]
    assert "NeMo-Gym answers" not in results and "/run accepts policy_base_url" not in results
    assert results["settings"].detail == "valid; no SWE rows: NEMO_GYM_URL's server is not used"
    assert results["rows' environments"].detail.endswith("no SWE rows, so NEMO_GYM_URL's server is not checked")
    assert good["gym"].requests == []


def test_an_environment_missing_from_nemo_gym_envs_is_named_with_the_fix(good: dict[str, Any]) -> None:
    rows = environment_rows("mcqa", 1) + environment_rows("xlam_fc", 1)
    with serving(resources_document()) as mcqa:
        failure = only_failure(with_environments(good, rows, nemo_gym_envs=env_config(mcqa=mcqa.url)))
    assert failure.name == "environment xlam_fc"
    assert failure.detail == (
        "rows of --prompt-data are marked nemogym_env='xlam_fc', which NEMO_GYM_ENVS (from the recipe) does not name"
    )
    assert failure.fix is not None and "miles-nemogym serve --env xlam_fc" in failure.fix
    assert "--nemo-gym-env xlam_fc=http://<host>:<port>" in failure.fix


def test_a_misspelt_environment_s_fix_is_to_convert_again_not_to_serve_it(
    good: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rows = environment_rows("mcqa", 1) + environment_rows("mcq", 1)
    with serving(resources_document()) as mcqa:
        failure = only_failure(with_environments(good, rows, nemo_gym_envs=env_config(mcqa=mcqa.url)))
        assert failure.name == "environment mcq" and failure.fix is not None
        assert failure.fix.startswith(
            "'mcq' is not an environment nemo-gym ships (did you mean mcqa, mrcr?): re-run `miles-nemogym convert` "
            "with the right --env name"
        )
        assert "serve --env mcq`" not in failure.fix  # serve refuses it
        assert "if 'mcq' is your own environment, start its resources server and pass --nemo-gym-env mcq=" in (
            failure.fix
        )
        # Without the wheel in the cache nothing is downloaded: both fixes are given.
        monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(tmp_path / "empty-cache"))
        failure = only_failure(with_environments(good, rows, nemo_gym_envs=env_config(mcqa=mcqa.url)))
    assert failure.fix is not None and failure.fix.startswith(
        "start its resources server (`miles-nemogym serve --env mcq`) if nemo-gym ships it; if the name is "
        "misspelt, re-run `miles-nemogym convert` with the right --env name"
    )
    assert not (tmp_path / "empty-cache").exists()


def test_an_eval_set_s_environment_is_checked_too(good: dict[str, Any]) -> None:
    holdout = write_jsonl(good["tmp"] / "holdout.jsonl", environment_rows("mcqa", 1))
    failure = only_failure(run(good, config={"eval_data": {"mcqa": holdout}}))
    assert failure.name == "environment mcqa"
    assert failure.detail.startswith("rows of --eval-data mcqa are marked nemogym_env='mcqa'")
    assert "(from NEMO_GYM_ENVS unset)" in failure.detail


def test_an_environment_server_that_does_not_answer(good: dict[str, Any]) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    failure = only_failure(with_environments(good, environment_rows("mcqa", 1), nemo_gym_envs=env_config(mcqa=down)))
    assert failure.name == "environment mcqa"
    assert failure.detail == f"GET {down}/openapi.json: connection refused (nothing listens on that port)"
    assert failure.fix is not None and failure.fix.startswith("start its resources server (`miles-nemogym serve --env")
    assert "--nemo-gym-env mcqa=http://<host>:<port>" in failure.fix


def test_a_tool_the_server_does_not_declare_is_named(good: dict[str, Any]) -> None:
    rows = environment_rows("wa", 2, WA_TOOLS)
    with serving(resources_document(WA_TOOLS[:1])) as wa:
        failure = only_failure(with_environments(good, rows, nemo_gym_envs=env_config(wa=wa.url)))
        assert failure.name == "environment wa"
        assert failure.detail == (
            f"{wa.url} declares no POST /<tool> for 1 of the 2 tools its rows give the model "
            "(calendar_create_event): each call would answer the model with a 404"
        )
        assert failure.fix is not None and "--nemo-gym-env wa=" in failure.fix
        assert "pass --tools-not-served wa" in failure.fix
        # An environment whose verifier only reads the calls (xlam_fc) is let through by name.
        results = with_environments(good, rows, nemo_gym_envs=env_config(wa=wa.url), tools_not_served=["wa"])
    assert results["environment wa"].ok
    assert results["environment wa"].detail.endswith("and 1 of the rows' 2 tools (--tools-not-served)")


def test_a_catch_all_route_serves_every_tool(good: dict[str, Any]) -> None:
    with serving(resources_document(any_tool=True)) as wa:  # as workplace_assistant declares its 27 tools
        results = with_environments(good, environment_rows("wa", 1, WA_TOOLS), nemo_gym_envs=env_config(wa=wa.url))
    assert (
        results["environment wa"].detail
        == f"{wa.url}: POST /seed_session, /verify and every tool (POST /{{tool_name}})"
    )


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        (resources_document(WA_TOOLS, routes=("/verify",)), "no POST /seed_session"),
        (resources_document(WA_TOOLS, routes=("/seed_session",)), "no POST /verify"),
        (openapi_document(), "no POST /seed_session, /verify"),  # the mini_swe_agent_2 agent server
        ({"detail": "Not Found"}, "the document is not an OpenAPI schema (no 'paths')"),
    ],
)
def test_a_server_that_is_not_a_resources_server(good: dict[str, Any], document: Any, problem: str) -> None:
    with serving(document) as server:
        failure = only_failure(
            with_environments(good, environment_rows("wa", 1, WA_TOOLS), nemo_gym_envs=env_config(wa=server.url))
        )
    assert failure.detail == f"{server.url} answers but is not a NeMo-Gym resources server ({problem})"
    assert failure.fix is not None and "whose /openapi.json lists POST /seed_session and /verify" in failure.fix


def test_a_server_in_nemo_gym_envs_is_checked_even_without_rows_in_the_sample(good: dict[str, Any]) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    results = run(good, config={"nemo_gym_envs": env_config(mcqa=down)})  # SWE rows only
    assert results["environment mcqa"].status is Status.failed
    assert results["rows' environments"].detail == "SWE 5 rows of 5 read"


def test_every_row_of_a_jsonl_file_is_counted_and_a_few_per_environment_parsed(
    good: dict[str, Any], gym_example_rows: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(preflight, "_PARSED_PER_ENVIRONMENT", 2)
    # A rare environment at the very end of a file of large SWE rows; a prompt quoting the mark.
    swe = prompt_rows(gym_example_rows)
    swe[0]["prompt"][0]["content"] += ' "nemogym_env": "quoted"'
    late = environment_rows("rare", 3, ("late_tool",))
    late[2]["metadata"]["responses_create_params"]["tools"][0]["name"] = "third_rows_tool"  # not parsed
    with serving(resources_document()) as mcqa:
        results = with_environments(good, swe * 40 + late, nemo_gym_envs=env_config(mcqa=mcqa.url))
    assert results["rows' environments"].detail == "SWE 200, rare 3 rows of 203 read"
    failure = only_failure(results)
    assert failure.name == "environment rare"
    assert "rows of --prompt-data are marked nemogym_env='rare'" in failure.detail
    with serving(resources_document(("late_tool",))) as rare:
        assert with_environments(good, swe + late, nemo_gym_envs=env_config(rare=rare.url))["environment rare"].ok


def test_rows_marked_with_the_catalogs_spelling_are_that_environments_rows_not_swe_rows(
    good: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent runs a row marked resources_servers/mcqa as an mcqa row (its short name); so does preflight,
    # for the rows it parses and for those it only counts.
    monkeypatch.setattr(preflight, "_PARSED_PER_ENVIRONMENT", 1)
    rows = environment_rows("mcqa", 3)
    for row in rows:
        row["metadata"]["nemogym_env"] = "resources_servers/mcqa"
    results = with_environments(good, rows)
    assert results["rows' environments"].detail.startswith("mcqa 3 rows of 3 read")
    failure = only_failure(results)
    assert failure.name == "environment mcqa"
    assert "marked nemogym_env='mcqa', which NEMO_GYM_ENVS (from NEMO_GYM_ENVS unset) does not name" in failure.detail
    with serving(resources_document()) as mcqa:
        assert with_environments(good, rows, nemo_gym_envs=env_config(mcqa=mcqa.url))["environment mcqa"].ok


def test_rows_naming_their_environment_by_agent_ref_alone_are_that_environments_rows(good: dict[str, Any]) -> None:
    # Counted as SWE rows, they passed with NEMO_GYM_ENVS unset; the agent runs each as an mcqa row.
    rows = environment_rows("mcqa", 2)
    for row in rows:
        del row["metadata"]["nemogym_env"]
        row["metadata"]["agent_ref"] = {"type": "responses_api_agents", "name": "mcqa_simple_agent"}
    results = with_environments(good, rows)
    assert results["rows' environments"].detail.startswith("mcqa 2 rows of 2 read")
    assert only_failure(results).name == "environment mcqa"


def test_an_environment_row_without_its_task_is_refused(good: dict[str, Any]) -> None:
    rows = environment_rows("mcqa", 1)
    del rows[0]["metadata"]["responses_create_params"]
    with serving(resources_document()) as mcqa:
        results = with_environments(good, rows, nemo_gym_envs=env_config(mcqa=mcqa.url))
    assert results["prompt data"].status is Status.failed
    assert "row 1: an environment row (nemogym_env='mcqa'): metadata.responses_create_params must be an object" in (
        results["prompt data"].detail
    )


def test_an_environment_row_the_episode_could_not_send_is_refused_as_convert_refuses_it(good: dict[str, Any]) -> None:
    rows = environment_rows("mcqa", 1)
    rows[0]["metadata"]["responses_create_params"]["input"] = [{"type": "input_image", "image_url": "x"}]
    with serving(resources_document()) as mcqa:
        results = with_environments(good, rows, nemo_gym_envs=env_config(mcqa=mcqa.url))
    assert results["prompt data"].status is Status.failed
    assert "row 1: an environment row (nemogym_env='mcqa'): metadata.responses_create_params.input[0]" in (
        results["prompt data"].detail
    )
