"""``miles-nemogym serve``'s flag checks: bad values exit 2 with the flag named, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_start_timeout_must_be_a_positive_number_of_seconds(value: str) -> None:
    result = CliRunner().invoke(app, ["serve", "--sandbox", "local", "--start-timeout", value])
    assert result.exit_code == 2
    message = " ".join(result.stderr.split())  # rich wraps long lines
    assert f"error: --start-timeout: {float(value):g} is not a positive number of seconds" in message
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "content", [bytes(range(256)), "exec: {default_timeout_s: 300}\n".encode("utf-16")], ids=["binary", "utf-16"]
)
def test_provider_config_that_is_not_utf8_text_exits_2_with_the_fix(tmp_path: Path, content: bytes) -> None:
    config = tmp_path / "provider.yaml"
    config.write_bytes(content)
    result = CliRunner().invoke(app, ["serve", "--sandbox", "local", "--provider-config", str(config)])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())  # rich wraps long lines
    assert "provider.yaml: not UTF-8 text (a binary file, or saved as UTF-16?); give a YAML file saved as UTF-8" in (
        message
    )
    assert result.exception is None or isinstance(result.exception, SystemExit)
