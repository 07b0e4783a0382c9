"""One ValidationError formatter: each caller names the field its own way; none shows "Value error,"."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from miles_nemogym.cli._serve import as_flag
from miles_nemogym.episode.run import RequestError, build_run_body
from miles_nemogym.errors import SettingsError, describe, problems
from miles_nemogym.launcher._config import ConfigError, load_config
from miles_nemogym.runtime import current
from miles_nemogym.scan._config import ScanConfig, scan_settings
from miles_nemogym.settings import ENV_VARS


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step_limit: int
    host: str = "h"

    @field_validator("host")
    @classmethod
    def _no_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("host must not be empty; use 127.0.0.1")
        return value


def _error(values: dict[str, object]) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        _Options.model_validate(values)
    return caught.value


def test_problems_name_each_field_and_drop_pydantics_prefix() -> None:
    error = _error({"step_limit": "x", "host": " ", "colour": 1})
    assert problems(error) == [
        "step_limit: Input should be a valid integer, unable to parse string as an integer",
        "host: host must not be empty; use 127.0.0.1",
        "colour: Extra inputs are not permitted",
    ]
    assert problems(error, as_flag, unknown_key="unknown option")[::2] == [
        "--step-limit: Input should be a valid integer, unable to parse string as an integer",
        "--colour: unknown option",
    ]
    assert describe(_error({"step_limit": 1, "host": ""}), "options") == (
        "options.host: host must not be empty; use 127.0.0.1"
    )


def test_callers_name_the_field_their_way(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RequestError) as request:
        build_run_body({"instance_id": "a", "responses_create_params": {"top_k": 3}}, None, policy_base_url=None)
    assert str(request.value) == (
        "responses_create_params.top_k: the NeMo-Gym server rejects this key; remove it from the task row"
    )
    with pytest.raises(ConfigError) as launcher:
        load_config({"num_rollotu": 5}, {})
    assert str(launcher.value).endswith(
        "--num-rollotu / recipe key 'num_rollotu': unknown setting "
        "(see `examples/swebench_grpo/run.py --help` for the valid ones)"
    )
    with pytest.raises(SettingsError) as scan:
        scan_settings(ScanConfig(input_path=tmp_path, gym_url="ftp://x"))
    assert str(scan.value).startswith("invalid miles-nemogym configuration: --gym-url / NEMO_GYM_URL: ")
    monkeypatch.setenv("NEMO_GYM_RUN_TIMEOUT", "1h")
    with pytest.raises(SettingsError) as settings:
        _ = current().settings
    assert str(settings.value).startswith("invalid miles-nemogym configuration: NEMO_GYM_RUN_TIMEOUT='1h': ")
    for text in (str(request.value), str(launcher.value), str(scan.value), str(settings.value)):
        assert "Value error" not in text
