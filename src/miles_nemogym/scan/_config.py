"""What one scan is asked to do, and the plugin ``Settings`` it runs with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from miles_nemogym.scan._results import Mode
from miles_nemogym.settings import Settings

__all__ = ["ScanConfig", "scan_settings", "usage_problems"]


class ScanConfig(BaseModel):
    """A scan's parameters (the CLI flags, one field each)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_path: Path
    output_path: Path | None = None
    resume: bool = False
    golden: bool = False
    limit: int | None = Field(default=None, ge=1)
    instance_ids: tuple[str, ...] | None = None
    concurrency: int = Field(default=4, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)  # None keeps NEMO_GYM_RUN_TIMEOUT
    gym_url: str | None = None  # None keeps NEMO_GYM_URL
    policy_base_url: str | None = None
    temperature: float | None = None
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    subset: str | None = None
    split: str | None = None
    allow_unresolved: bool = False  # a model failing a task is not a broken server; infra failures still exit 1

    @field_validator("policy_base_url")
    @classmethod
    def _check_policy_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                "--policy-base-url must be an http(s) URL of an OpenAI-compatible API, "
                "such as https://host/v1 (the server appends /chat/completions)"
            )
        return value

    @property
    def mode(self) -> Mode:
        return "golden" if self.golden else "policy"

    def request_kwargs(self) -> dict[str, Any]:
        """The sampling flags under Miles' ``request_kwargs`` names (what the trainer sends)."""
        kwargs = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}
        return {key: value for key, value in kwargs.items() if value is not None}


def usage_problems(config: ScanConfig) -> list[str]:
    """Flag combinations that cannot mean what the user wants."""
    problems = []
    if not config.golden and config.policy_base_url is None:
        problems.append(
            "say which model answers: --golden (a server started with `miles-nemogym serve --golden` "
            "applies the gold patches, no model) or --policy-base-url URL (an OpenAI-compatible "
            "endpoint ending in /v1, its key in NEMO_GYM_POLICY_API_KEY); `miles-nemogym serve` configures "
            "no model of its own, so a scan with neither would only wait on one that cannot answer"
        )
    if config.golden and config.policy_base_url:
        problems.append(
            "--golden with --policy-base-url: a golden server applies the gold patches and never "
            "calls a model; drop --policy-base-url (golden) or --golden (API-policy scan)"
        )
    if config.golden and config.allow_unresolved:
        problems.append("--golden with --allow-unresolved: a golden scan expects every reward to be 1.0")
    if config.resume and config.output_path is None:
        problems.append("--resume needs --output (the results file to continue)")
    return problems


def scan_settings(config: ScanConfig) -> Settings:
    """The settings read from the environment, with this scan's flags; raises ``SettingsError``."""
    given = {"gym_url": config.gym_url, "run_timeout_s": config.timeout_s}  # None keeps the variable's
    changes = {key: value for key, value in given.items() if value is not None}
    return Settings.from_env().with_overrides(labels=_FLAGS, max_concurrency=config.concurrency, **changes)


_FLAGS = {"gym_url": "--gym-url / NEMO_GYM_URL", "run_timeout_s": "--timeout", "max_concurrency": "--concurrency"}
