"""Every environment variable the plugin reads, validated in one place: the hooks read the process's
once (the runtime's ``settings``), the tools build their own (``from_env``, ``with_overrides``); a bad
value fails with a message naming the variable and the form it expects.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from enum import Enum
from functools import cached_property
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StrictInt, ValidationError, field_validator

from miles_nemogym.errors import KeyScrubber, SettingsError, UrlError, describe, key_scrubber, redact_urls
from miles_nemogym.transport import check_url

__all__ = [
    "ENV_VARS",
    "EnvironmentServer",
    "Settings",
    "environment_name_problem",
    "parse_environments",
    "short_name",
]


class TimeoutReward(str, Enum):
    """What an episode whose deadline passed while the policy held it gets (docs/episode-pipeline.md)."""

    lowest = "lowest"  # the episode's lowest reward, trained, as miles_nemogym:policy_timeout: stalling never pays
    zero = "zero"  # reward 0, trained, as miles_nemogym:policy_timeout (above losing where a range goes below 0)
    mask = "mask"  # set aside as agent_timeout, as every other timeout is


class RewardMode(str, Enum):
    """How the reward hook (``agent.reward_func``) turns an episode into a scalar."""

    binary = "binary"  # the server's reward: 1.0 only when SWE-bench reports the instance resolved
    partial = "partial"  # the fraction of FAIL_TO_PASS tests passing, when every PASS_TO_PASS test passes


_ENV_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
SWE_ENVIRONMENT = "swe"  # the rows of NEMO_GYM_URL's /run (mini_swe_agent_2); NEMO_GYM_ENVS cannot name it
_MAX_STEPS_LIMIT = 10_000  # the largest max_steps accepted: more model turns than any context holds


class EnvironmentServer(BaseModel):
    """One environment's resources server, as ``NEMO_GYM_ENVS`` gives it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str  # the resources server's base URL (/seed_session, /<tool>, /verify are appended)
    max_steps: StrictInt | None = Field(default=None, ge=1, le=_MAX_STEPS_LIMIT)  # most model turns; None: no limit
    agent: str | None = None  # the agent server that plays the rows by its /run; unset: the simple_agent loop here
    reward_range: tuple[float, float] | None = None  # a valid reward's inclusive [low, high]; unset: the variable's

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return _check_http_url(value, "http://gym-host:8001")

    @field_validator("agent")
    @classmethod
    def _check_agent(cls, value: str | None) -> str | None:
        return None if value is None else _check_http_url(value, "http://gym-host:8002", "the agent server")

    @field_validator("reward_range", mode="before")
    @classmethod
    def _check_reward_range(cls, value: object) -> object:
        expected = "expected [low, high]: two finite JSON numbers with low <= high, such as [-1, 1]"
        if value is None:
            return None
        if not isinstance(value, (list, tuple)) or any(
            isinstance(end, bool) or not isinstance(end, (int, float)) for end in value
        ):
            raise ValueError(expected)
        return _range(value, expected)

    def valid_rewards(self, default: tuple[float, float]) -> tuple[float, float]:
        return default if self.reward_range is None else self.reward_range


class Settings(BaseModel):
    """The plugin's configuration, each field aliased by its environment variable (README.md, "Settings")."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    gym_url: str = Field(default="http://localhost:12000", alias="NEMO_GYM_URL")
    run_timeout_s: float = Field(default=3600.0, gt=0, alias="NEMO_GYM_RUN_TIMEOUT", allow_inf_nan=False)
    connect_timeout_s: float = Field(default=10.0, gt=0, alias="NEMO_GYM_CONNECT_TIMEOUT", allow_inf_nan=False)
    max_concurrency: int = Field(default=4096, ge=1, alias="NEMO_GYM_MAX_CONCURRENCY")
    policy_api_key: SecretStr | None = Field(default=None, alias="NEMO_GYM_POLICY_API_KEY")
    rollout_secret: SecretStr | None = Field(default=None, alias="NEMO_GYM_ROLLOUT_SECRET")
    external_host: str | None = Field(default=None, alias="MILES_ROUTER_EXTERNAL_HOST")  # dialled by NeMo-Gym
    reward_mode: RewardMode = Field(default=RewardMode.binary, alias="NEMO_GYM_REWARD_MODE")
    timeout_reward: TimeoutReward = Field(default=TimeoutReward.lowest, alias="NEMO_GYM_TIMEOUT_REWARD")
    reward_range_text: str = Field(default="0,1", alias="NEMO_GYM_REWARD_RANGE")  # low,high: see reward_range
    max_result_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, alias="NEMO_GYM_MAX_RESULT_BYTES")
    min_valid_per_group: int = Field(default=2, ge=0, alias="NEMO_GYM_MIN_VALID_PER_GROUP")
    outage_timeout_s: float = Field(default=900.0, gt=0, alias="NEMO_GYM_OUTAGE_TIMEOUT", allow_inf_nan=False)
    max_failure_streak: int = Field(default=64, ge=0, alias="NEMO_GYM_MAX_FAILURE_STREAK")
    environments_text: str | None = Field(default=None, alias="NEMO_GYM_ENVS")  # JSON: see ``environments``
    episode_dir: str | None = Field(default=None, alias="NEMO_GYM_EPISODE_DIR")

    @field_validator("gym_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return _check_http_url(value, "http://gym-host:12000", "the server")

    @field_validator("environments_text")
    @classmethod
    def _check_environments(cls, value: str | None) -> str | None:
        if value is not None:  # stripped and not blank: _blank_is_unset ran first
            parse_environments(value)
        return value

    @cached_property
    def environments(self) -> Mapping[str, EnvironmentServer]:
        """Environment name -> its server (empty when ``NEMO_GYM_ENVS`` is unset), parsed once."""
        return MappingProxyType(parse_environments(self.environments_text) if self.environments_text else {})

    @field_validator("reward_range_text")
    @classmethod
    def _check_range(cls, value: str) -> str:
        _parse_range(value)
        return value.strip()

    @property
    def reward_range(self) -> tuple[float, float]:
        return _parse_range(self.reward_range_text)

    @field_validator(
        "external_host", "policy_api_key", "rollout_secret", "episode_dir", "environments_text", mode="before"
    )
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return (value.strip() or None) if isinstance(value, str) else value

    def key_scrubber(self) -> KeyScrubber | None:
        """What removes the policy API key from outside text; None when there is nothing to hide."""
        return None if self.policy_api_key is None else key_scrubber(self.policy_api_key.get_secret_value())

    def scrub_text(self, text: str) -> str:
        """``text`` with the policy API key removed (a failure reason, a log line)."""
        scrubber = self.key_scrubber()
        return text if scrubber is None else scrubber.scrub_text(text)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The variables in ``environ`` (default: os.environ), validated; ``SettingsError`` names each bad one."""
        source = os.environ if environ is None else environ
        given = {name: source[name] for name in ENV_VARS if name in source}
        try:
            return cls.model_validate(given)
        except ValidationError as error:
            raise SettingsError("invalid miles-nemogym configuration: " + _describe(error, given)) from None

    def with_overrides(self, labels: Mapping[str, str] | None = None, **changes: Any) -> Settings:
        """These settings with ``changes`` (by field name) validated like the variables; ``labels`` names
        a field in a ``SettingsError`` (e.g. by its CLI flag) instead of its variable."""
        values = self.model_dump(by_alias=True)
        aliased = {_alias(name): value for name, value in changes.items()}
        try:
            return type(self).model_validate({**values, **aliased})
        except ValidationError as error:
            named = {_alias(name): label for name, label in (labels or {}).items()}
            raise SettingsError("invalid miles-nemogym configuration: " + _describe(error, aliased, named)) from None


def _check_http_url(value: str, example: str, run_appended_to: str | None = None) -> str:
    try:
        check_url(value)
    except UrlError as error:  # reported by pydantic for the variable that holds the value
        raise ValueError(f"{error}; expected an http(s) URL such as {example}") from None
    value = value.strip().rstrip("/")
    if run_appended_to and value.endswith("/run"):
        raise ValueError(f"give {run_appended_to}'s base URL; '/run' is appended by the plugin")
    return value


def short_name(name: str) -> str:
    """An environment's key: ``name`` of ``resources_servers/[group/]name`` (the catalog's spelling), else as given."""
    head, slash, tail = name.partition("/")
    parts = tail.split("/")
    return parts[-1] if slash and head == "resources_servers" and len(parts) <= 2 and all(parts) else name


def environment_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an environment (a ``NEMO_GYM_ENVS`` key, a row's ``nemogym_env``), or None."""
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        return "use letters, digits, '_', '-' or '.' (at most 128, starting with a letter or digit)"
    if name == SWE_ENVIRONMENT:
        return f"{SWE_ENVIRONMENT!r} is reserved for NEMO_GYM_URL's /run rows"
    return None


def parse_environments(text: str) -> dict[str, EnvironmentServer]:
    """``NEMO_GYM_ENVS``'s one parser: name -> server; ``ValueError`` says what is wrong."""
    form = (
        'a JSON object such as {"mcqa": "http://gym-host:8001", '
        '"xlam_fc": {"url": "http://gym-host:8002", "max_steps": 4}, '
        '"blackjack": {"url": "http://gym-host:8003", "agent": "http://gym-host:8004", "reward_range": [-1, 1]}}'
    )
    try:
        raw = json.loads(text, object_pairs_hook=_refuse_duplicates)
    except SettingsError as duplicate:
        raise ValueError(str(duplicate)) from None
    except (ValueError, RecursionError):
        raise ValueError(f"not JSON; expected {form}") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"expected {form}")
    servers: dict[str, EnvironmentServer] = {}
    spelled: dict[str, str] = {}
    for said, value in raw.items():
        name = short_name(said) if isinstance(said, str) else said  # the catalog's spelling is its short name
        problem = environment_name_problem(name)
        if problem:
            raise ValueError(f"environment name {said!r}: {problem}")
        if name in spelled:
            raise ValueError(f"the keys {spelled[name]!r} and {said!r} name one environment, {name!r}; give one")
        spelled[name] = said
        given = {"url": value} if isinstance(value, str) else value
        try:
            servers[name] = EnvironmentServer.model_validate(given)
        except ValidationError as error:
            raise ValueError(f"environment {name!r}: {describe(error)}") from None
    return servers


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' object hook: a key given twice is refused (JSON itself would keep the last)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise SettingsError(f"the key {key!r} is given twice (JSON would silently keep the last); give it once")
        seen[key] = value
    return seen


def _parse_range(text: str) -> tuple[float, float]:
    return _range(text.split(","), "expected two finite numbers 'low,high' with low <= high, such as 0,1")


def _range(ends: Sequence[Any], expected: str) -> tuple[float, float]:
    """Two finite numbers ``low <= high`` (texts, or JSON numbers), else ``ValueError(expected)``."""
    try:
        low, high = map(float, ends)  # a huge JSON integer overflows a float
    except (ValueError, OverflowError):
        raise ValueError(expected) from None
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ValueError(expected)
    return low, high


# Aliases, i.e. the environment variable names, in field order.
ENV_VARS: tuple[str, ...] = tuple(
    str(field.alias) for field in Settings.model_fields.values() if field.alias is not None
)
_SECRET_VARS = frozenset({"NEMO_GYM_POLICY_API_KEY", "NEMO_GYM_ROLLOUT_SECRET"})


def _alias(name: str) -> str:
    field = Settings.model_fields.get(name)
    if field is None or field.alias is None:
        raise TypeError(f"Settings has no field {name!r}")
    return field.alias


def _describe(error: ValidationError, given: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> str:
    def label(loc: Sequence[int | str]) -> str:
        var = str(loc[0]) if loc else "?"  # located by alias: the variable's name
        if labels and var in labels:
            return labels[var]
        shown = "<hidden>" if var in _SECRET_VARS else redact_urls(str(given.get(var, "<unset>")))
        return f"{var}={shown!r}"

    return describe(error, label=label)
