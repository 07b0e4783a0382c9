"""A dataset id without a reachable hub fails in seconds, with the converter's usual message."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from tests.support.ports import free_port


def test_hub_id_without_a_reachable_hub_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused at once
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    started = time.monotonic()
    result = CliRunner().invoke(
        app, ["convert", "--input", "princeton-nlp/SWE-bench_Verified", "--output", str(tmp_path / "o.jsonl")]
    )
    elapsed = time.monotonic() - started
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    assert message.startswith(
        f"error: princeton-nlp/SWE-bench_Verified: cannot load it from the dataset hub ({endpoint} does not answer:"
    )
    assert message.endswith(
        "without access to the hub, download it elsewhere and pass the folder or a parquet/JSONL file"
    )
    assert elapsed < 5
    assert not (tmp_path / "o.jsonl").exists()
