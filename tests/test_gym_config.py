"""The NeMo-Gym server's config and venv recipe (``serve``).

Unit tests cover our layer: the overrides, provider options, the interpreter search
and the recipe read from the wheel. The composition tests (marked ``integration``:
they need the Python 3.13 server venv) run nemo-gym's own config parser on the
shipped configs of every provider and check that the result is what the server gets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from miles_nemogym.gym import venv as gym_venv
from miles_nemogym.gym.config import (
    AGENT_CONFIG,
    LOCAL_ENVIRONMENT_KWARGS,
    MODEL_CONFIG,
    PLACEHOLDER_POLICY_URL,
    RAY_HEAD_KEY,
    SANDBOXES,
    SERVER_NAME,
    ServeOptions,
    compose_config_yaml,
    load_provider_options,
    overrides,
    planned_config,
    provider_config_path,
)
from miles_nemogym.gym.venv import (
    GYM_PYTHON_ENV,
    GymEnvironmentError,
    GymPythonNotFoundError,
    find_gym_python,
    gym_python_candidates,
    requirements,
    venv_key,
)
from miles_nemogym.pins import MINI_SWE_AGENT_VERSION, NEMO_GYM_VERSION, SWEBENCH_VERSION
from tests.support.scripts import shell_script

# ----------------------------------------------------------------------------- overrides


def _agent(data: dict[str, Any]) -> dict[str, Any]:
    section: dict[str, Any] = data[SERVER_NAME]["responses_api_agents"][SERVER_NAME]
    return section


def test_overrides_carry_every_serve_option(tmp_path: Path) -> None:
    options = ServeOptions(
        sandbox="docker",
        host="0.0.0.0",
        concurrency=7,
        step_limit=11,
        step_timeout=33,
        eval_timeout=44,
        golden=True,
        policy_model_name="qwen",
    )
    data = overrides(options, 12345, tmp_path)
    agent = _agent(data)
    assert agent == {
        "host": "0.0.0.0",
        "port": 12345,
        "concurrency": 7,
        "step_limit": 11,
        "step_timeout": 33,
        "eval_timeout": 44,
        "run_golden": True,
    }
    assert data["policy_model_name"] == "qwen"
    assert data["policy_base_url"] == PLACEHOLDER_POLICY_URL
    assert data["results_dir"] == str(tmp_path / "results")
    # A container provider gets no host-only tweaks: its own block stays as shipped.
    assert data["sandbox"] == {"docker": {}}
    assert "sandbox_environment_kwargs" not in agent


def test_local_overrides_keep_the_host_safe(tmp_path: Path) -> None:
    data = overrides(ServeOptions(sandbox="local"), 2000, tmp_path)
    assert _agent(data)["sandbox_environment_kwargs"] == {
        "cwd": "",
        "activate_conda": False,
        "user": None,
        "conda_env": "testbed",
    }
    assert data["sandbox"]["local"]["workspace_root"] == str(tmp_path / "workspaces")


def test_local_workspace_root_from_provider_options_wins(tmp_path: Path) -> None:
    options = ServeOptions(sandbox="local", provider_options={"workspace_root": "/data/ws", "concurrency": 2})
    data = overrides(options, 2000, tmp_path)
    assert data["sandbox"]["local"] == {"workspace_root": "/data/ws", "concurrency": 2}


def test_golden_flag_defaults_off(tmp_path: Path) -> None:
    assert _agent(overrides(ServeOptions(), 2000, tmp_path))["run_golden"] is False
    assert _agent(overrides(ServeOptions(golden=True), 2000, tmp_path))["run_golden"] is True


def test_provider_options_go_under_the_chosen_provider(tmp_path: Path) -> None:
    options = ServeOptions(sandbox="docker", provider_options={"exec": {"concurrency": 3}})
    assert overrides(options, 2000, tmp_path)["sandbox"] == {"docker": {"exec": {"concurrency": 3}}}


def test_a_whole_sandbox_block_is_accepted(tmp_path: Path) -> None:
    block = {"sandbox": {"default_metadata": {"team": "rl"}, "daytona": {"batch": {"concurrency": 1}}}}
    options = ServeOptions(sandbox="daytona", provider_options=block)
    assert overrides(options, 2000, tmp_path)["sandbox"] == block["sandbox"]


def test_a_sandbox_block_for_another_provider_is_refused(tmp_path: Path) -> None:
    options = ServeOptions(sandbox="docker", provider_options={"sandbox": {"daytona": {}}})
    with pytest.raises(GymEnvironmentError, match=r"sandbox\.docker"):
        overrides(options, 2000, tmp_path)


def test_overrides_need_a_concrete_port(tmp_path: Path) -> None:
    with pytest.raises(GymEnvironmentError, match="port"):
        overrides(ServeOptions(), 0, tmp_path)


@pytest.mark.parametrize(
    ("field", "value"),
    [("sandbox", "kubernetes"), ("concurrency", 0), ("port", 70000), ("host", "  "), ("step_limit", 0)],
)
def test_bad_serve_options_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        ServeOptions.model_validate({field: value})


@pytest.mark.parametrize("address", ["10.0.0.1:6379", "head.cluster:6379", "[::1]:6379"])
def test_a_ray_address_joins_that_cluster(tmp_path: Path, address: str) -> None:
    options = ServeOptions(ray_address=f" {address} ")
    assert overrides(options, 2000, tmp_path)[RAY_HEAD_KEY] == address
    assert RAY_HEAD_KEY not in overrides(ServeOptions(), 2000, tmp_path)  # a private Ray otherwise


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("ray://10.0.0.1:10001", "Ray Client"),
        ("http://10.0.0.1:8265", "Ray Client"),
        ("10.0.0.1", "not host:port"),
        ("10.0.0.1:0", "not host:port"),
        (":6379", "not host:port"),
        ("auto", "not host:port"),
    ],
)
def test_a_ray_address_must_be_host_and_port(address: str, says: str) -> None:
    with pytest.raises(ValueError, match=rf"ray_address(.|\n)*{says}"):
        ServeOptions(ray_address=address)


def test_provider_options_file(tmp_path: Path) -> None:
    good = tmp_path / "provider.yaml"
    good.write_text("exec:\n  default_timeout_s: 300\n")
    assert load_provider_options(good) == {"exec": {"default_timeout_s": 300}}
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_provider_options(empty) == {}
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(GymEnvironmentError, match="expected a mapping"):
        load_provider_options(listed)
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1, 2\n")
    with pytest.raises(GymEnvironmentError, match="not valid YAML"):
        load_provider_options(broken)
    with pytest.raises(GymEnvironmentError, match="cannot read"):
        load_provider_options(tmp_path / "missing.yaml")


# ----------------------------------------------------------------------------- recipe


def test_recipe_is_the_wheels_requirements_plus_the_pins() -> None:
    reqs = requirements("local")
    assert f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}" in reqs
    assert f"swebench=={SWEBENCH_VERSION}" in reqs
    assert "tenacity>=9.1.4" in reqs
    # Read from the wheel: the server's own pins, and no optional extras.
    assert any(r.startswith("openai==") for r in reqs)
    assert any(r.startswith("ray[default]") for r in reqs)
    assert not any("extra ==" in r for r in reqs)
    assert not any(r.startswith(("vllm", "pytest", "daytona")) for r in reqs)


@pytest.mark.parametrize(
    ("sandbox", "sdk"),
    [
        ("daytona", "daytona"),
        ("e2b", "e2b"),
        ("opensandbox", "opensandbox"),
        ("openshell", "openshell"),  # from nemo-gym's `openshell` extra, not `sandbox`
        ("ecs_fargate", "boto3"),
    ],
)
def test_sdk_providers_get_their_sdk_and_their_own_venv(sandbox: str, sdk: str) -> None:
    reqs = requirements(sandbox)
    assert [r for r in reqs if r.startswith(sdk)], reqs
    assert venv_key(sandbox) != venv_key("local")
    assert venv_key("docker") == venv_key("local")


def test_venv_key_names_every_pin() -> None:
    key = venv_key()
    for version in (NEMO_GYM_VERSION, MINI_SWE_AGENT_VERSION, SWEBENCH_VERSION):
        assert version in key


# ----------------------------------------------------------------------------- interpreter


@pytest.fixture
def no_system_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gym_venv, "SYSTEM_DIRS", ())


def test_explicit_interpreter_that_does_not_exist(tmp_path: Path) -> None:
    env = {GYM_PYTHON_ENV: str(tmp_path / "nope" / "python3.13")}
    with pytest.raises(GymPythonNotFoundError, match=GYM_PYTHON_ENV):
        find_gym_python(env)


def test_explicit_interpreter_of_the_wrong_version(tmp_path: Path) -> None:
    fake = shell_script(tmp_path / "python", "echo 3.11")
    with pytest.raises(GymPythonNotFoundError, match=r"is Python 3\.11, not 3\.13"):
        find_gym_python({GYM_PYTHON_ENV: str(fake)})


def test_no_interpreter_says_how_to_install_one(tmp_path: Path, no_system_python: None) -> None:
    env = {"PATH": str(tmp_path / "empty-bin"), "HOME": str(tmp_path)}
    with pytest.raises(GymPythonNotFoundError) as caught:
        find_gym_python(env)
    message = str(caught.value)
    assert "pyenv install 3.13" in message
    assert GYM_PYTHON_ENV in message


def test_a_failing_pyenv_shim_is_skipped_for_a_working_pyenv_version(tmp_path: Path, no_system_python: None) -> None:
    shim = shell_script(tmp_path / "shims" / "python3.13", "echo 'pyenv: python3.13: command not found' >&2; exit 127")
    old = shell_script(tmp_path / "pyenv" / "versions" / "3.13.9" / "bin" / "python3.13", "echo 3.13")
    new = shell_script(tmp_path / "pyenv" / "versions" / "3.13.10" / "bin" / "python3.13", "echo 3.13")
    env = {"PATH": str(shim.parent), "PYENV_ROOT": str(tmp_path / "pyenv"), "HOME": str(tmp_path / "home")}
    assert gym_python_candidates(env) == [shim, new, old]
    assert find_gym_python(env) == new


def test_the_failures_are_listed_per_candidate(tmp_path: Path, no_system_python: None) -> None:
    shim = shell_script(tmp_path / "shims" / "python3.13", "echo 'pyenv: no such version' >&2; exit 127")
    with pytest.raises(GymPythonNotFoundError) as caught:
        find_gym_python({"PATH": str(shim.parent), "HOME": str(tmp_path)})
    assert f"{shim}: exits 127: pyenv: no such version" in str(caught.value)


# ----------------------------------------------------------------------------- composition


@pytest.fixture(scope="module")
def server_venv() -> gym_venv.GymVenv:
    try:
        return gym_venv.ensure_gym_venv("local")
    except GymPythonNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)


def _shipped_provider_block(venv: gym_venv.GymVenv, sandbox: str) -> dict[str, Any]:
    """nemo-gym's own config block for ``sandbox`` ({} when it ships none, e.g. apptainer)."""
    path = venv.site_packages / provider_config_path(sandbox)
    if not path.is_file():
        return {}
    block: dict[str, Any] = yaml.safe_load(path.read_text())["sandbox"][sandbox]
    return block


def _assert_within(part: Any, whole: Any, path: str) -> None:
    """Every leaf of ``part`` is in ``whole`` with the same value."""
    if isinstance(part, dict):
        assert isinstance(whole, dict), path
        for key, value in part.items():
            assert key in whole, f"{path}.{key}"
            _assert_within(value, whole[key], f"{path}.{key}")
    else:
        assert part == whole, path


@pytest.mark.integration
@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_nemo_gym_composes_each_provider(sandbox: str, server_venv: gym_venv.GymVenv, tmp_path: Path) -> None:
    options = ServeOptions(sandbox=sandbox, concurrency=3, step_limit=9, ray_address="10.0.0.1:6379")  # type: ignore[arg-type]
    composed = yaml.safe_load(compose_config_yaml(options, server_venv, 23456, tmp_path))
    # What `serve --dry-run` prints (from the wheel, no venv) is what nemo-gym's parser makes of it.
    _assert_within(planned_config(options, 23456, tmp_path), composed, "")
    agent = _agent(composed)
    assert (agent["port"], agent["concurrency"], agent["step_limit"]) == (23456, 3, 9)
    assert agent["sandbox_provider"] == "sandbox"
    # The whole shipped provider block arrives, under the name the agent references.
    shipped = _shipped_provider_block(server_venv, sandbox)
    assert set(shipped) <= set(composed["sandbox"][sandbox])
    assert sandbox in composed["sandbox"]
    assert set(composed["sandbox"]) <= {"default_metadata", sandbox}
    assert composed["policy_model"]["responses_api_models"]["vllm_model"]["base_url"] == "${policy_base_url}"
    if sandbox == "local":
        assert agent["sandbox_environment_kwargs"] == LOCAL_ENVIRONMENT_KWARGS
    else:
        assert agent["sandbox_environment_kwargs"]["cwd"] == "/testbed"


@pytest.mark.integration
def test_provider_secrets_stay_unresolved(
    server_venv: gym_venv.GymVenv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAYTONA_API_KEY", "dtn-secret-value")
    text = compose_config_yaml(ServeOptions(sandbox="daytona"), server_venv, 23456, tmp_path)
    assert "dtn-secret-value" not in text
    assert yaml.safe_load(text)["sandbox"]["daytona"]["connection"]["api_key"] == "${oc.env:DAYTONA_API_KEY}"


@pytest.mark.integration
def test_provider_options_merge_over_the_shipped_block(server_venv: gym_venv.GymVenv, tmp_path: Path) -> None:
    options = ServeOptions(
        sandbox="docker", provider_options={"exec": {"concurrency": 3}, "create": {"use_init": False}}
    )
    composed = yaml.safe_load(compose_config_yaml(options, server_venv, 23456, tmp_path))
    docker = composed["sandbox"]["docker"]
    assert docker["exec"]["concurrency"] == 3
    assert docker["create"]["use_init"] is False
    shipped = _shipped_provider_block(server_venv, "docker")
    # Keys the user did not touch keep nemo-gym's values.
    assert docker["exec"]["default_timeout_s"] == shipped["exec"]["default_timeout_s"]
    assert docker["create"]["keepalive_shell"] == shipped["create"]["keepalive_shell"]


@pytest.mark.integration
def test_golden_flag_reaches_the_composed_config(server_venv: gym_venv.GymVenv, tmp_path: Path) -> None:
    text = compose_config_yaml(ServeOptions(golden=True), server_venv, 23456, tmp_path)
    assert _agent(yaml.safe_load(text))["run_golden"] is True


def test_a_failing_composer_reports_its_stderr(tmp_path: Path) -> None:
    # A venv whose interpreter fails (e.g. a broken install): the error carries its stderr.
    site = tmp_path / "venv" / "lib" / "site-packages"
    for relative in (AGENT_CONFIG, MODEL_CONFIG):
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_text("{}\n")
    python = shell_script(
        tmp_path / "venv" / "bin" / "python", "echo 'ConfigError: bad merge at sandbox.docker' >&2; exit 3"
    )
    broken = gym_venv.GymVenv(path=tmp_path / "venv", python=python, site_packages=site)
    with pytest.raises(GymEnvironmentError, match=r"nemo-gym rejected the server config(.|\n)*sandbox\.docker"):
        compose_config_yaml(ServeOptions(sandbox="docker"), broken, 23456, tmp_path / "state")


def test_missing_shipped_configs_are_named(tmp_path: Path) -> None:
    empty = gym_venv.GymVenv(path=tmp_path, python=tmp_path / "python", site_packages=tmp_path)
    with pytest.raises(GymEnvironmentError, match=r"mini_swe_agent_2\.yaml"):
        compose_config_yaml(ServeOptions(), empty, 23456, tmp_path / "state")


def test_the_callers_python_settings_do_not_reach_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 3.11 PYTHONPATH inside the 3.13 build would import the wrong packages.
    monkeypatch.setenv("PYTHONPATH", "/should/not/leak")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    env = gym_venv._clean_env()
    assert "PYTHONPATH" not in env
    assert "PIP_NO_INDEX" not in env


# ----------------------------------------------------------------------------- serve command


def test_serve_refuses_bad_options_before_building_anything(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from miles_nemogym.cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--sandbox", "kubernetes", "--concurrency", "0"])
    assert result.exit_code == 2
    assert "--sandbox" in result.output
    assert "--concurrency" in result.output
    listed = tmp_path / "provider.yaml"
    listed.write_text("- not\n- a mapping\n")
    result = runner.invoke(app, ["serve", "--provider-config", str(listed)])
    assert result.exit_code == 2
    assert "expected a mapping" in result.output


# ----------------------------------------------------------------------------- venv publication


def _fake_build(calls: list[Path], fail: bool = False) -> Any:
    """Stands in for the pip build: lays out what a ready venv has, or fails halfway."""

    def build(python: Path, target: Path, sandbox: str, progress: Any) -> None:
        calls.append(target)
        (target / "bin").mkdir(parents=True)
        (target / "bin" / "python").write_text("")
        if fail:
            raise gym_venv.GymVenvBuildError("pip install failed (exit 1)")
        site = target / "lib" / "site-packages"
        (site / gym_venv.AGENT_RELATIVE_DIR).mkdir(parents=True)
        (site / gym_venv.AGENT_RELATIVE_DIR / "app.py").write_text("")
        (target / gym_venv.READY_MARKER).write_text('{"site_packages": "lib/site-packages"}')

    return build


def test_a_venv_is_published_once_and_debris_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(tmp_path))
    root = gym_venv.gym_venv_root()
    debris = root / f"{venv_key()}.build-crashed"
    (debris / "bin").mkdir(parents=True)  # a build killed halfway, never published
    calls: list[Path] = []
    monkeypatch.setattr(gym_venv, "_build", _fake_build(calls))
    ready = gym_venv.ensure_gym_venv("local", progress=lambda line: None, python=Path("/bin/true"))
    assert ready.path == root / venv_key()
    assert ready.path.is_symlink()
    assert (ready.agent_dir / "app.py").is_file()
    assert not debris.exists()
    again = gym_venv.ensure_gym_venv("local", progress=lambda line: None, python=Path("/bin/true"))
    assert again == ready
    assert len(calls) == 1


def test_a_failed_build_leaves_nothing_that_looks_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(tmp_path))
    calls: list[Path] = []
    monkeypatch.setattr(gym_venv, "_build", _fake_build(calls, fail=True))
    with pytest.raises(gym_venv.GymVenvBuildError, match="pip install failed"):
        gym_venv.ensure_gym_venv("local", progress=lambda line: None, python=Path("/bin/true"))
    root = gym_venv.gym_venv_root()
    assert not (root / venv_key()).exists()
    assert not calls[0].exists()
    assert list(root.glob("*.build-*")) == []
