"""Smoke, the launcher's preflight and the doctor CLI pass ``Settings``: none changes ``os.environ``.

Each is run concurrently with a different Gym URL; every run must reach its own server
and the process environment must be the same before, during and after.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym import checks
from miles_nemogym.checks import _server_probe as server_probe
from miles_nemogym.cli.main import app
from miles_nemogym.errors import SettingsError
from miles_nemogym.launcher import _checks as launch_checks
from miles_nemogym.launcher._config import LauncherConfig
from miles_nemogym.smoke import _swe as smoke
from tests.support.loopback_gym import LoopbackGym

SHELL_URL = "http://127.0.0.1:9"
"""What the shell's NEMO_GYM_URL says: a closed port, so an episode or check that read it fails."""


@pytest.fixture
def shell_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("NEMO_GYM_URL", SHELL_URL)
    monkeypatch.setenv("NEMO_GYM_CONNECT_TIMEOUT", "2")
    for name in ("MILES_ROUTER_EXTERNAL_HOST", "NEMO_GYM_POLICY_API_KEY", "NEMO_GYM_EPISODE_DIR"):
        monkeypatch.delenv(name, raising=False)
    return environment()


def environment() -> dict[str, str]:
    """``os.environ`` without the variable pytest itself updates per test phase."""
    return {name: value for name, value in os.environ.items() if name != "PYTEST_CURRENT_TEST"}


def run_concurrently(jobs: list[Callable[[], Any]]) -> list[Any]:
    barrier = threading.Barrier(len(jobs))

    def start(job: Callable[[], Any]) -> Any:
        barrier.wait(timeout=30)
        return job()

    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(start, jobs))


@contextmanager
def environ_watched(expected: dict[str, str]) -> Iterator[list[str]]:
    """Polls ``os.environ`` while the block runs; yields the changes it saw (none expected)."""
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.001):
            if environment() != expected:
                seen.append(os.environ.get("NEMO_GYM_URL", "<unset>"))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join(timeout=10)


def test_concurrent_smoke_runs_each_use_their_own_server_and_leave_the_environment(
    shell_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(smoke, "GymServer", LoopbackGym)
    monkeypatch.setattr(smoke, "ensure_gym_venv", lambda sandbox, progress: None)
    LoopbackGym.servers = []
    jobs = [
        lambda folder=folder: smoke.run_smoke(state_dir=folder, limit=2, policy_base_url="http://127.0.0.1:9/v1")
        for folder in (tmp_path / "a", tmp_path / "b")
    ]
    with environ_watched(shell_env) as changes:
        reports = run_concurrently(jobs)
    assert changes == []
    assert environment() == shell_env
    assert [len(server.bodies) for server in LoopbackGym.servers] == [2, 2]  # each run reached its own server
    for report in reports:
        assert [e.record.status for e in report.episodes] == ["ok", "ok"]
        assert report.chain_worked


def test_a_smoke_run_with_invalid_settings_fails_before_starting_anything(
    shell_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(smoke, "ensure_gym_venv", lambda sandbox, progress: pytest.fail("started"))
    monkeypatch.setenv("NEMO_GYM_RUN_TIMEOUT", "1h")
    with pytest.raises(SettingsError, match="NEMO_GYM_RUN_TIMEOUT='1h'"):
        smoke.run_smoke(state_dir=tmp_path, limit=1)


def test_concurrent_preflights_check_their_own_recipe_url_and_leave_the_environment(
    shell_env: dict[str, str], tmp_path: Path
) -> None:
    urls = [f"http://127.0.0.1:{port}" for port in (7001, 7002, 7003, 7004)]
    fetched: dict[str, str | None] = {}

    def fetch(url: str, timeout_s: float) -> Any:
        fetched[url] = os.environ.get("NEMO_GYM_URL")  # what the process environment said meanwhile
        raise server_probe.FetchError("connect", "refused")

    def one(url: str) -> list[checks.CheckResult]:
        config = LauncherConfig(
            prompt_data=tmp_path / "absent.jsonl",
            base_dir=tmp_path,
            nemo_gym_url=url,
            router_external_host="trainer-node",
        )
        return preflight(config, fetch)

    with environ_watched(shell_env) as changes:
        results = run_concurrently([lambda url=url: one(url) for url in urls])
    assert changes == []
    assert environment() == shell_env
    assert fetched == {f"{url}/openapi.json": SHELL_URL for url in urls}
    for url, found in zip(urls, results, strict=True):
        by_name = {check.name: check for check in found}
        assert by_name["settings"].detail == f"NeMo-Gym server {url} (from the recipe)"
        assert "trainer-node" in by_name["policy host dialable from the Gym host"].detail


def test_the_doctor_flag_overrides_the_variable_without_setting_it(shell_env: dict[str, str]) -> None:
    done = CliRunner().invoke(app, ["doctor", "--gym-url", "http://127.0.0.1:7005", "--timeout", "1"])
    assert done.exit_code == 1
    assert "NeMo-Gym server http://127.0.0.1:7005" in done.output
    assert "GET http://127.0.0.1:7005/openapi.json" in done.output
    assert environment() == shell_env


def preflight(config: LauncherConfig, fetch: Any) -> list[checks.CheckResult]:
    """The launcher's checks with this shell's environment, 8 GPUs and no Miles checkout."""
    return launch_checks.run_preflight(
        config,
        environ=dict(os.environ),
        miles_root=None,
        hook_paths=(),
        gpu_counter=lambda env: (8, "stub"),
        fetch=fetch,
    )


def test_the_preflight_checks_the_plugin_variables_the_job_will_get(
    shell_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refused(url: str, timeout_s: float) -> Any:
        raise server_probe.FetchError("connect", "refused")

    def settings_check(**recipe: Any) -> checks.CheckResult:
        config = LauncherConfig(prompt_data=tmp_path / "absent.jsonl", base_dir=tmp_path, **recipe)
        checks = preflight(config, refused)
        return next(check for check in checks if check.name == "settings")

    bad_extra = settings_check(nemo_gym_url="http://127.0.0.1:7006", extra_env={"NEMO_GYM_RUN_TIMEOUT": "1h"})
    assert bad_extra.status is checks.Status.failed
    assert "NEMO_GYM_RUN_TIMEOUT='1h'" in bad_extra.detail
    monkeypatch.setenv("NEMO_GYM_MAX_CONCURRENCY", "")  # empty: not forwarded, so the job uses the default
    assert settings_check(nemo_gym_url="http://127.0.0.1:7006").status is checks.Status.passed
    recipe = LauncherConfig(prompt_data=tmp_path / "absent.jsonl", base_dir=tmp_path, nemo_gym_url="http://gym:1")
    shell = {
        "NEMO_GYM_URL": SHELL_URL,
        "MILES_ROUTER_EXTERNAL_HOST": "shell-host",
        "PATH": "/bin",
        "NEMO_GYM_MAX_FAILURE_STREAK": "",
    }
    assert launch_checks.plugin_environment(recipe, shell) == {
        "NEMO_GYM_URL": "http://gym:1",  # the recipe's, not the shell's
        "MILES_ROUTER_EXTERNAL_HOST": "shell-host",  # forwarded: Ray workers see only the job's environment
        "NEMO_GYM_EPISODE_DIR": str(recipe.resolved_episode_dir),
    }
