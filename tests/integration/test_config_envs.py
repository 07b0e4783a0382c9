"""Configs of a resources server with several (``resources_servers/NAME/CONFIG`` in NeMo-Gym's
catalog) served by that name as a real ``serve`` process, their rows from ``examples`` and
``convert`` by the same name, played through ``agent.run`` against the real servers; and every
such catalog entry planned from the config the catalog names, under a short name no other
entry has."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym import agent
from miles_nemogym.cli.main import app
from miles_nemogym.gym.catalog import load_catalog
from miles_nemogym.gym.environments import plan
from miles_nemogym.gym.venv import GymEnvironmentError, ensure_gym_venv
from miles_nemogym.settings import Settings, short_name
from tests.support.config_envs import SERVED
from tests.support.scripted_chat import ScriptedChat, Turn, tagged, tool
from tests.support.serve_process import exported, serving

pytestmark = pytest.mark.integration


def _converted_row(name: str, folder: Path) -> dict[str, Any]:
    """The first row ``examples --env NAME`` gives, as ``convert --env NAME=FILE`` writes it."""
    raw, converted = folder / f"{short_name(name)}.raw.jsonl", folder / f"{short_name(name)}.jsonl"
    shown = CliRunner().invoke(app, ["examples", "--env", name, "--output", str(raw)])
    assert shown.exit_code == 0, shown.output
    done = CliRunner().invoke(app, ["convert", "--env", f"{name}={raw}", "--output", str(converted)])
    assert done.exit_code == 0, done.output
    metadata: dict[str, Any] = json.loads(converted.read_text().splitlines()[0])["metadata"]
    return metadata


def _answers(name: str, row: dict[str, Any]) -> dict[str, tuple[Turn, ...]]:
    """A gold and a wrong answer: equivalence_rule's lc.yaml grades the text exactly; the single
    tool call config rewards a get_weather call."""
    if name.endswith("/lc"):
        gold = str(row["expected_answer"])
        return {"gold": (Turn(content=gold),), "wrong": (Turn(content=gold[::-1] + "?"),)}
    return {
        "gold": (Turn(tool_calls=(tool("get_weather", city="San Francisco"),)), Turn(content="Sunny.")),
        "wrong": (Turn(content="I cannot tell."),),
    }


@pytest.mark.timeout(600)
async def test_configs_are_served_and_played_by_their_catalog_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arguments = ["--no-swe", "--port", "0", "--state-dir", str(tmp_path / "state")]
    with serving(*arguments, *(f"--env={name}" for name in SERVED), env=dict(os.environ)) as serve:
        printed = exported(serve.printed)
        assert "NEMO_GYM_ENVS" in printed, serve.printed
        servers = Settings.from_env(printed).environments
        assert sorted(servers) == sorted(short_name(name) for name in SERVED)
        # The trainer may spell the keys as the catalog does: the same environments.
        spelled = {name: servers[short_name(name)].url for name in SERVED}
        monkeypatch.setenv("NEMO_GYM_ENVS", json.dumps(spelled))
        with ScriptedChat() as chat:

            async def one(name: str, outcome: str) -> dict[str, Any]:
                row = _converted_row(name, tmp_path)
                assert row["nemogym_env"] == short_name(name)
                script = f"{short_name(name)}-{outcome}"
                chat.script(script, *_answers(name, row)[outcome])
                return await agent.run(
                    base_url=chat.session_url(script),
                    prompt=[],
                    request_kwargs={"temperature": 1.0, "top_p": 1.0, "max_tokens": 256},
                    metadata={**tagged(row, script), "max_seq_len": 8192, "session_server_id": "s"},
                )

            cases = [(name, outcome) for name in SERVED for outcome in ("gold", "wrong")]
            outs = await asyncio.gather(*(one(name, outcome) for name, outcome in cases))
        rest = serve.stop()
    assert serve.process.returncode == 0, rest
    for (name, outcome), out in zip(cases, outs, strict=True):
        record = out["nemogym"]
        assert (record["status"], record["environment"]) == ("ok", short_name(name)), record
        assert out["reward"] == (1.0 if outcome == "gold" else 0.0), (name, outcome, out["eval_report"])


def test_each_catalog_config_is_planned_from_the_config_the_catalog_names_under_its_own_short_name() -> None:
    entries = [e for e in load_catalog(ensure_gym_venv()) if e.kind == "environment"]
    shorts = [e.short_name or e.name for e in entries]
    assert len(set(shorts)) == len(shorts)  # one rule, and no two environments share a name
    configs = [e for e in entries if e.name.count("/") == 2 and e.name.startswith("resources_servers/")]
    assert len(configs) == 54  # nemo-gym 0.7.0
    planned = 0
    for entry in configs:
        try:
            [p] = plan([entry.name])
        except GymEnvironmentError as refused:  # a refusal names what is missing, never the name
            assert "not a config nemo-gym ships" not in str(refused) and "not an environment" not in str(refused)
            continue
        assert (p.name, p.config) == (entry.name.rsplit("/", 1)[1], entry.config)
        planned += 1
    assert planned >= 45
