"""Counts agree in number: "1 server", "2 servers", never "server(s)"."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.errors import counted
from miles_nemogym.gym import environments as gym_envs
from miles_nemogym.gym.environments import EnvironmentServers, plan, setting
from miles_nemogym.smoke import _environments as smoke_envs


def test_counted_agrees_in_number() -> None:
    assert counted(1, "server") == "1 server"
    assert [counted(n, "server") for n in (0, 2)] == ["0 servers", "2 servers"]
    assert counted(1, "episode or seal", "episodes or seals") == "1 episode or seal"
    assert counted(3, "episode or seal", "episodes or seals") == "3 episodes or seals"


def test_starting_one_server_says_one_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (mcqa,) = plan(["mcqa"])
    said: list[str] = []
    gym = SimpleNamespace(site_packages=tmp_path)
    servers = EnvironmentServers(gym, [mcqa], state_dir=tmp_path, progress=said.append)  # type: ignore[arg-type]
    assert not servers.routed
    monkeypatch.setattr(gym_envs, "environment_python", lambda *_a, **_k: Path("python"))
    monkeypatch.setattr(servers, "compose", lambda: servers.config)
    servers.config = {mcqa.instance: {"resources_servers": {"mcqa": {}}}}
    monkeypatch.setattr(servers, "_spawn", lambda *_a: None)
    monkeypatch.setattr(servers, "_wait", lambda *_a: None)
    servers.start()
    assert f"starting 1 server: {mcqa.instance}" in said, said


class _Servers:
    """Stands in for the environments' servers: nothing starts, every URL answers nothing."""

    rollout_secret = "s" * 40

    def __init__(self, _venv: Any, plans: list[Any], **_: Any) -> None:
        self.plans = plans

    def start(self) -> _Servers:
        return self

    def urls(self) -> dict[str, str]:
        return {p.name: "http://127.0.0.1:9" for p in self.plans}

    def agent_urls(self) -> dict[str, str]:
        return {}

    def setting(self, advertised: bool = True) -> str:
        return setting(self.plans, self.urls(), self.agent_urls())

    def stop(self) -> None:
        pass


def test_smoke_of_one_environment_says_one_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run_rows(rows: list[Any], _urls: Any, _sampling: Any, _settings: Any, done: Any, _extra: Any) -> Any:
        results = [{"reward": 0.0, "nemogym": {"status": "ok", "turns": 1}} for _ in rows]
        for index, result in enumerate(results):
            done(index, result)
        return results

    monkeypatch.setattr(smoke_envs, "ensure_gym_venv", lambda *_a, **_k: None)
    monkeypatch.setattr(smoke_envs, "EnvironmentServers", _Servers)
    monkeypatch.setattr(smoke_envs, "run_rows", run_rows)
    monkeypatch.setattr(smoke_envs, "file_as_step", lambda _folder: (0, 0))
    monkeypatch.setenv("COLUMNS", "200")
    done = CliRunner().invoke(app, ["smoke", "--env", "mcqa", "--limit", "1", "--state-dir", str(tmp_path / "state")])
    said = " ".join(done.output.split())
    assert "episodes of 1 environment" in said, done.output
    assert "environment(s)" not in said and "episode(s)" not in said
