"""No secret leaves the package: an API key and a URL password through every user-facing path.

With ``NEMO_GYM_POLICY_API_KEY`` set and passwords in ``NEMO_GYM_URL`` and in the Miles
session URL, this runs a scan, smoke-style episodes through ``agent.run`` (one episode
whose server answer echoes the key, one HTTP 500, one graded, one against a server that
is down), the rollout metrics, ``doctor`` and the launcher's ``--dry-run``, all against
real loopback servers, and searches every channel for either secret: returned records,
log records, the results file, metric keys and values, and everything printed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.launcher import run as launcher
from miles_nemogym.metrics import rollout_metrics
from miles_nemogym.runtime import current
from miles_nemogym.settings import ENV_VARS, Settings
from miles_nemogym.smoke import _swe as smoke
from tests.support.fault_server import FaultServer
from tests.support.ports import free_port as closed_port
from tests.support.prompt_rows import converter_rows, write_jsonl
from tests.support.samples import Sample

API_KEY = "sk-e2e-policy-key-7f3a9c2d41"
GYM_PASSWORD = "gym-pass-5b8e1d"
SESSION_PASSWORD = "session-pass-c4f2a0"
SECRETS = (API_KEY, GYM_PASSWORD, SESSION_PASSWORD)


def with_password(url: str, password: str) -> str:
    return url.replace("http://", f"http://trainer:{password}@", 1)


def leaks(channel: str, text: str) -> list[str]:
    return [f"{channel} holds {secret!r}" for secret in SECRETS if secret in text]


class NothingStarts:
    """Launcher actions for a dry run: any call is a failure."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a dry run must not {name}")


def test_no_channel_shows_the_api_key_or_a_url_password(
    gym_in_thread: FaultServer,
    gym_example_rows: list[dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NEMO_GYM_OUTAGE_TIMEOUT", "1")  # the server-down episode waits this long, then fails
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", API_KEY)
    gym_url = with_password(gym_in_thread.url, GYM_PASSWORD)
    monkeypatch.setenv("NEMO_GYM_URL", gym_url)
    caplog.set_level(logging.DEBUG)
    rows = converter_rows(gym_example_rows)
    ids = [row["metadata"]["instance_id"] for row in rows]
    gym_in_thread.modes = {ids[0]: "echo_key_error", ids[1]: "500", ids[2]: "error_metadata"}
    found: list[str] = []

    # 1. A scan in API-policy mode: the key is sent, and one answer echoes it.
    input_file = write_jsonl(tmp_path / "in.jsonl", rows)
    results = tmp_path / "results.jsonl"
    scanned = CliRunner().invoke(
        app,
        ["scan", "--input", str(input_file), "--output", str(results), "--allow-unresolved",
         "--policy-base-url", f"{gym_in_thread.url}/v1"],  # it must answer: the stand-in's 404 does
    )  # fmt: skip
    assert scanned.exit_code == 1, scanned.output  # the echo and the 500 are infrastructure failures
    assert [body.get("policy_api_key") for body in gym_in_thread.bodies] == [API_KEY] * len(
        rows
    )  # it did reach the server
    found += leaks("scan output", scanned.output)
    found += leaks("scan results file", results.read_text())
    assert len(results.read_text().splitlines()) == len(rows)

    # 2. Smoke-style episodes through agent.run, as Miles calls it, session URLs with a password.
    session = with_password("http://127.0.0.1:30000/sessions/s1", SESSION_PASSWORD)
    records = asyncio.run(smoke.run_rows(rows, [session] * len(rows), {"temperature": 0.7}, Settings.from_env()))
    monkeypatch.setenv("NEMO_GYM_URL", with_password(f"http://127.0.0.1:{closed_port()}", GYM_PASSWORD))
    records += asyncio.run(smoke.run_rows(rows[:1], [session], {}, Settings.from_env()))
    kinds = [record["nemogym"]["failure_kind"] for record in records]
    assert kinds[-1] == "transport_unreachable" and "agent_run_error" in kinds
    found += leaks("agent.run records", json.dumps(records))
    metrics = rollout_metrics([Sample(metadata=record) for record in records], current().ledger.drain())
    found += leaks("metric keys and values", json.dumps(metrics))

    # 3. doctor, against the live server and its password URL.
    monkeypatch.setenv("NEMO_GYM_URL", gym_url)
    doctor = CliRunner().invoke(app, ["doctor"])
    assert doctor.exit_code == 0, doctor.output
    found += leaks("doctor output", doctor.output)

    # 4. The launcher's --dry-run: the exact command and job environment.
    capsys.readouterr()
    assert launcher.main(["--dry-run", "--miles-root", str(tmp_path / "no-miles")], actions=NothingStarts()) == 0
    printed = capsys.readouterr()
    assert "NEMO_GYM_URL='http://trainer:***@127.0.0.1:" in printed.out
    found += leaks("launcher --dry-run", printed.out + printed.err)

    log_text = "\n".join(
        f"{record.getMessage()} {record.exc_text or ''} {record.exc_info or ''}" for record in caplog.records
    )
    assert "NeMo-Gym episode failed" in log_text  # the failures were logged
    found += leaks("logs", log_text + caplog.text)
    assert found == []
