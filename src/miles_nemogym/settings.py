"""Every environment variable the plugin reads, validated in one place.

Miles loads our hooks by dotted path and gives them no configuration object, so the
hooks are configured through the environment of the rollout process (and of the Ray job
the launcher submits). Reading each variable ad hoc would let a typo such as
``NEMO_GYM_RUN_TIMEOUT=1h`` silently fall back to a default; here a bad value fails
with a message naming the variable and the form it expects.

Settings are cached per distinct environment, so a process that changes its environment
(tests, a launcher that sets variables late) always sees the values in force, while the
hot path (one call per episode) pays for validation only once.
"""

from __future__ import annotations

import math
import os
from enum import Enum
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from miles_nemogym.errors import MilesNemoGymError
from miles_nemogym.redaction import redact_url


class RewardMode(str, Enum):
    """How ``miles_nemogym.reward`` turns an episode into a scalar."""

    binary = "binary"
    """The server's reward: 1.0 only when SWE-bench reports the instance resolved."""
    partial = "partial"
    """Fraction of FAIL_TO_PASS tests passing, when every PASS_TO_PASS test passes."""


class SettingsError(MilesNemoGymError, ValueError):
    """A configuration value is missing or malformed; the message names the fix."""


class Settings(BaseSettings):
    """The plugin's configuration, read from environment variables (names below)."""

    model_config = SettingsConfigDict(env_prefix="", case_sensitive=True, extra="ignore")

    gym_url: str = Field(default="http://localhost:12000", alias="NEMO_GYM_URL")
    """Base URL of the NeMo-Gym ``mini_swe_agent_2`` server (``/run`` is appended)."""

    run_timeout_s: float = Field(default=3600.0, gt=0, alias="NEMO_GYM_RUN_TIMEOUT", allow_inf_nan=False)
    """Whole-episode deadline in seconds, including time queued behind the server's
    concurrency limit. The server has no episode limit of its own."""

    connect_timeout_s: float = Field(default=10.0, gt=0, alias="NEMO_GYM_CONNECT_TIMEOUT", allow_inf_nan=False)
    """Seconds to establish a TCP connection to the server."""

    max_concurrency: int = Field(default=4096, ge=1, alias="NEMO_GYM_MAX_CONCURRENCY")
    """Most ``/run`` requests this process holds open at once; the connection pool is
    sized to it so no episode waits silently behind a pool limit."""

    retry_attempts: int = Field(default=5, ge=1, le=100, alias="NEMO_GYM_RETRY_ATTEMPTS")
    """Attempts for a request that certainly never reached the server."""

    retry_backoff_s: float = Field(default=1.0, gt=0, alias="NEMO_GYM_RETRY_BACKOFF", allow_inf_nan=False)
    """First backoff delay; doubles per attempt with full jitter."""

    retry_backoff_max_s: float = Field(default=30.0, gt=0, alias="NEMO_GYM_RETRY_BACKOFF_MAX", allow_inf_nan=False)

    policy_api_key: SecretStr | None = Field(default=None, alias="NEMO_GYM_POLICY_API_KEY")
    """Bearer token the harness sends to the policy endpoint. Never logged or returned."""

    external_host: str | None = Field(default=None, alias="MILES_ROUTER_EXTERNAL_HOST")
    """Host the NeMo-Gym server can dial to reach this node's session server. The
    name is the upstream Miles example's, kept for compatibility."""

    reward_mode: RewardMode = Field(default=RewardMode.binary, alias="NEMO_GYM_REWARD_MODE")

    reward_range_text: str = Field(default="0,1", alias="NEMO_GYM_REWARD_RANGE")
    """Inclusive range of a valid server reward, as ``low,high``; ``mini_swe_agent_2``
    rewards are 0.0 or 1.0. A reward outside it is not a measurement: the sample is masked.
    (A string, parsed by ``reward_range``: pydantic-settings would read a tuple as JSON.)"""

    max_result_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, alias="NEMO_GYM_MAX_RESULT_BYTES")
    """Largest decoded ``/run`` result accepted. Real results are ~100 KB; the cap stops a
    compressed or runaway answer from exhausting the rollout process's memory."""

    min_valid_per_group: int = Field(default=2, ge=0, alias="NEMO_GYM_MIN_VALID_PER_GROUP")
    """Valid episodes a prompt group needs to be trained when some of its episodes failed
    (GRPO over the valid ones; the failed ones get zero loss). Clamped to the group's size;
    0 drops a group on any failure."""

    outage_timeout_s: float = Field(default=900.0, gt=0, alias="NEMO_GYM_OUTAGE_TIMEOUT", allow_inf_nan=False)
    """Seconds episodes wait for an unreachable server before failing and stopping the run."""

    max_failure_streak: int = Field(default=64, ge=0, alias="NEMO_GYM_MAX_FAILURE_STREAK")
    """Consecutive failed episodes, with no valid one between, that stop the run (0: never)."""

    episode_dir: str | None = Field(default=None, alias="NEMO_GYM_EPISODE_DIR")
    """Folder of the episode store (every episode's answer and record, per step and
    role; ``store/writer.py``). Unset: no store."""

    @field_validator("gym_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("expected an http(s) URL such as http://gym-host:12000")
        if parts.path.endswith("/run"):
            raise ValueError("give the server's base URL; '/run' is appended by the plugin")
        try:
            parts.port  # noqa: B018 - urlsplit checks the port only when asked
        except ValueError:
            raise ValueError("the port must be a number from 1 to 65535, as in http://gym-host:12000") from None
        if parts.port == 0:
            raise ValueError("the port must be a number from 1 to 65535, as in http://gym-host:12000")
        return value

    @field_validator("reward_range_text")
    @classmethod
    def _check_range(cls, value: str) -> str:
        _parse_range(value)
        return value.strip()

    @property
    def reward_range(self) -> tuple[float, float]:
        return _parse_range(self.reward_range_text)

    @field_validator("external_host", "policy_api_key", "episode_dir", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        return value.strip() if isinstance(value, str) else value

    @property
    def run_url(self) -> str:
        return f"{self.gym_url}/run"


def _parse_range(text: str) -> tuple[float, float]:
    expected = "expected two finite numbers 'low,high' with low <= high, such as 0,1"
    low_text, sep, high_text = text.partition(",")
    try:
        low, high = float(low_text), float(high_text)
    except ValueError:
        raise ValueError(expected) from None
    if not (sep and math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ValueError(expected)
    return low, high


# Aliases, i.e. the environment variable names, in field order.
ENV_VARS: tuple[str, ...] = tuple(
    str(field.alias) for field in Settings.model_fields.values() if field.alias is not None
)

_cache: dict[tuple[str | None, ...], Settings] = {}


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        name = str(item["loc"][0]) if item["loc"] else "?"
        field = Settings.model_fields.get(name)
        var = field.alias if field is not None and field.alias else name
        secret = var == "NEMO_GYM_POLICY_API_KEY"
        given = "<hidden>" if secret else redact_url(os.environ.get(var, "<unset>"))
        lines.append(f"{var}={given!r}: {item['msg']}")
    return "invalid miles-nemogym configuration: " + "; ".join(lines)


def get_settings() -> Settings:
    """The settings for the current environment; raises ``SettingsError`` when invalid."""
    key = tuple(os.environ.get(name) for name in ENV_VARS)
    settings = _cache.get(key)
    if settings is None:
        try:
            settings = Settings()
        except ValidationError as error:
            raise SettingsError(_describe(error)) from None
        except ValueError as error:  # pydantic-settings' own errors (a value it failed to decode)
            raise SettingsError(f"invalid miles-nemogym configuration: {error}") from None
        if len(_cache) > 64:
            _cache.clear()
        _cache[key] = settings
    return settings
