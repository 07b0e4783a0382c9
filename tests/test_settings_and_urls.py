"""Settings validation and the policy URL rewrite."""

from __future__ import annotations

import pytest

from miles_nemogym.episode.run import RequestError, policy_base_url, routable_local_address
from miles_nemogym.errors import SettingsError
from miles_nemogym.runtime import Runtime, current, install
from miles_nemogym.settings import RewardMode, Settings


def test_defaults() -> None:
    s = Settings.from_env({})
    assert s.gym_url == "http://localhost:12000"
    assert s.run_timeout_s == 3600 and s.reward_mode is RewardMode.binary


@pytest.mark.parametrize(
    ("var", "value", "needle"),
    [
        ("NEMO_GYM_URL", "gym-host:12000", "http(s) URL"),
        ("NEMO_GYM_URL", "http://gym:12000/run", "'/run' is appended"),
        ("NEMO_GYM_RUN_TIMEOUT", "1h", "NEMO_GYM_RUN_TIMEOUT='1h'"),
        ("NEMO_GYM_RUN_TIMEOUT", "-5", "greater than 0"),
        ("NEMO_GYM_MAX_CONCURRENCY", "0", "NEMO_GYM_MAX_CONCURRENCY"),
        ("NEMO_GYM_REWARD_MODE", "dense", "'binary' or 'partial'"),
    ],
)
def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, var: str, value: str, needle: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({var: value})
    assert var in str(info.value) and needle in str(info.value)
    monkeypatch.setenv(var, value)  # the hooks' read of the process environment says the same
    with pytest.raises(SettingsError) as from_process:
        _ = current().settings
    assert str(from_process.value) == str(info.value)


def test_api_key_is_hidden_in_errors_and_repr() -> None:
    key = {"NEMO_GYM_POLICY_API_KEY": "sk-hidden-123"}
    assert "sk-hidden-123" not in repr(Settings.from_env(key))
    with pytest.raises(SettingsError) as info:
        Settings.from_env({**key, "NEMO_GYM_RUN_TIMEOUT": "x"})
    assert "sk-hidden-123" not in str(info.value)
    with pytest.raises(SettingsError) as bad_key:
        Settings.from_env({"NEMO_GYM_POLICY_API_KEY": 7})  # type: ignore[dict-item]
    assert "NEMO_GYM_POLICY_API_KEY='<hidden>'" in str(bad_key.value)


def test_the_process_settings_are_read_once_per_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_URL", "http://a:1/")
    first = current().settings
    assert first.gym_url == "http://a:1"
    monkeypatch.setenv("NEMO_GYM_URL", "http://b:2")
    assert current().settings is first  # the hooks read the environment once, on first use
    assert install().settings.gym_url == "http://b:2"  # a new run reads it again
    given = Settings.from_env({"NEMO_GYM_URL": "http://c:3"})
    assert install(Runtime(given)).settings is given  # or is handed its settings


def test_invalid_settings_are_read_again_until_they_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_GYM_RUN_TIMEOUT", "soon")
    with pytest.raises(SettingsError):
        _ = current().settings
    monkeypatch.setenv("NEMO_GYM_RUN_TIMEOUT", "60")
    assert current().settings.run_timeout_s == 60.0


def test_overrides_are_validated_like_the_variables() -> None:
    base = Settings.from_env({"NEMO_GYM_RUN_TIMEOUT": "60", "NEMO_GYM_POLICY_API_KEY": "sk-1"})
    changed = base.with_overrides(gym_url="http://gym:7/", max_concurrency=3)
    assert (changed.gym_url, changed.max_concurrency, changed.run_timeout_s) == ("http://gym:7", 3, 60.0)
    assert changed.policy_api_key is not None and changed.policy_api_key.get_secret_value() == "sk-1"
    assert base.gym_url == "http://localhost:12000"  # the original is unchanged (frozen)
    with pytest.raises(SettingsError) as info:
        base.with_overrides(gym_url="http://gym:7/run")
    assert "NEMO_GYM_URL='http://gym:7/run'" in str(info.value) and "'/run' is appended" in str(info.value)
    with pytest.raises(SettingsError) as labelled:
        base.with_overrides(labels={"run_timeout_s": "--timeout"}, run_timeout_s=-1)
    assert str(labelled.value) == "invalid miles-nemogym configuration: --timeout: Input should be greater than 0"
    with pytest.raises(TypeError, match="no field 'gym'"):
        base.with_overrides(gym="http://x:1")


@pytest.mark.parametrize(
    ("session", "external", "expected"),
    [
        ("http://10.1.2.3:30010/sessions/a", None, "http://10.1.2.3:30010/sessions/a/v1"),
        ("http://10.1.2.3:30010/sessions/a/", None, "http://10.1.2.3:30010/sessions/a/v1"),
        ("http://10.1.2.3:30010/sessions/a", "node7", "http://node7:30010/sessions/a/v1"),
        ("http://0.0.0.0:30010/sessions/a", None, "http://127.0.0.1:30010/sessions/a/v1"),
        ("http://[::]:30010/sessions/a", None, "http://127.0.0.1:30010/sessions/a/v1"),
        ("http://0.0.0.0:30010/sessions/a", "fd00::7", "http://[fd00::7]:30010/sessions/a/v1"),
    ],
)
def test_policy_base_url(session: str, external: str | None, expected: str) -> None:
    assert policy_base_url(session, "http://127.0.0.1:12000", external) == expected


def test_wildcard_resolves_to_the_route_towards_a_remote_gym_host() -> None:
    # 192.0.2.0/24 is TEST-NET-1: a UDP connect only consults the routing table, nothing is sent.
    try:
        address = routable_local_address("192.0.2.10", 12000)
    except RequestError:
        pytest.fail("this machine has a default route; the probe should find a source address")
    assert address not in ("0.0.0.0", "127.0.0.1")
    url = policy_base_url("http://0.0.0.0:1/sessions/a", "http://192.0.2.10:12000")
    assert url == f"http://{address}:1/sessions/a/v1"


def test_not_a_url_is_refused() -> None:
    with pytest.raises(RequestError, match="/sessions/<session_id>"):
        policy_base_url("sessions/a", "http://127.0.0.1:12000")


@pytest.mark.parametrize("session", ["http://h:abc/sessions/a", "http://h:99999/sessions/a", "http://[::1/sessions/a"])
def test_a_malformed_session_url_is_a_policy_url_error(session: str) -> None:
    with pytest.raises(RequestError, match="malformed"):
        policy_base_url(session, "http://127.0.0.1:12000")


def test_nemo_gym_envs_maps_names_to_resources_servers() -> None:
    given = '{"mcqa": "http://gym-host:8001/", "xlam_fc": {"url": "http://gym-host:8002", "max_steps": 4}}'
    envs = Settings.from_env({"NEMO_GYM_ENVS": given}).environments
    assert {name: (server.url, server.max_steps) for name, server in envs.items()} == {
        "mcqa": ("http://gym-host:8001", None),
        "xlam_fc": ("http://gym-host:8002", 4),
    }
    assert Settings.from_env({}).environments == {}
    assert Settings.from_env({"NEMO_GYM_ENVS": "  "}).environments == {}


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ("[]", "expected a JSON object"),
        ("mcqa=http://h:1", "not JSON"),
        ('{"swe": "http://h:1"}', "'swe' is reserved"),
        ('{"a b": "http://h:1"}', "environment name 'a b'"),
        ('{"mcqa": "ftp://h"}', "environment 'mcqa': url"),
        ('{"mcqa": {"url": "http://h:1", "max_steps": 0}}', "max_steps"),
        ('{"mcqa": {"url": "http://h:1", "steps": 3}}', "steps"),
    ],
)
def test_a_bad_nemo_gym_envs_names_the_variable_and_the_fix(given: str, named: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({"NEMO_GYM_ENVS": given})
    assert "NEMO_GYM_ENVS" in str(raised.value) and named in str(raised.value)
