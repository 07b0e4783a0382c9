"""``miles-nemogym smoke`` runs doctor's checks of what it is given before anything starts: invalid
settings or a ``--policy-base-url`` that does not answer end as a FAIL line with its fix and exit 2,
before the server's environment is built (minutes on a first run)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.settings import ENV_VARS
from miles_nemogym.smoke import _swe as smoke
from tests.support.ports import free_port


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)

    def build(sandbox: str, progress: Any) -> None:
        pytest.fail("the server's environment was built")

    monkeypatch.setattr(smoke, "ensure_gym_venv", build)


def said(*args: str) -> str:
    done = CliRunner().invoke(app, ["smoke", *args])
    assert done.exit_code == 2, done.output
    return " ".join(done.output.split())


def test_invalid_settings_are_a_fail_line_with_the_fix_and_the_password_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", "http://user:s3cret-pass@gym:12000/run")
    text = said()
    assert "s3cret-pass" not in text
    assert "FAIL settings: " in text and "http://user:***@gym:12000/run" in text
    assert "fix: set each variable named above to the form it expects" in text


def test_a_policy_that_does_not_answer_stops_smoke_before_anything_starts() -> None:
    policy = f"http://127.0.0.1:{free_port()}/v1"
    text = said("--policy-base-url", policy)
    assert f"FAIL policy endpoint answers: the policy endpoint does not answer: GET {policy}/models" in text
    assert "fix: start the policy server or correct --policy-base-url" in text
