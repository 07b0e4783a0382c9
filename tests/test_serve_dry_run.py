"""``serve --sandbox P --dry-run``: the composed config and exactly what P lacks, nothing started.

Each test runs on a bare host it controls: no provider variables, an empty PATH, HOME and
the package cache in its temporary folder (the wheel linked in, the server venv absent)
and a stand-in Python 3.13 for the interpreter search.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from miles_nemogym.cli.main import app
from miles_nemogym.gym.config import AGENT_CONFIG, SANDBOXES, SERVER_NAME, provider_config_path
from miles_nemogym.gym.wheel import wheel_path
from miles_nemogym.settings import Settings
from tests.support.ports import free_port
from tests.support.scripts import shell_script

_PROVIDER_VARIABLES = ("DAYTONA_", "E2B_", "AWS_", "OPENSANDBOX_", "OPENSHELL_", "ENROOT_", "NEMO_GYM_")


@pytest.fixture
def bare_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Returns the cache folder; PATH is ``tmp_path/bin`` (empty)."""
    wheel = wheel_path()
    for name in list(os.environ):
        if name.startswith(_PROVIDER_VARIABLES):
            monkeypatch.delenv(name)
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / wheel.name).symlink_to(wheel)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(cache))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("COLUMNS", "1000")  # one line per item on stderr
    monkeypatch.setenv("MILES_NEMOGYM_GYM_PYTHON", str(shell_script(tmp_path / "py313" / "python3.13", "echo 3.13")))
    return cache


def _dry_run(sandbox: str, *extra: str) -> tuple[Result, dict[str, Any], list[str]]:
    result = CliRunner().invoke(app, ["serve", "--sandbox", sandbox, "--port", "23456", "--dry-run", *extra])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    config = yaml.safe_load(result.stdout)
    missing = [line[4:] for line in result.stderr.splitlines() if line.startswith("  - ")]
    return result, config, missing


def _shipped(sandbox: str) -> dict[str, Any]:
    with zipfile.ZipFile(wheel_path()) as wheel:
        try:
            text = wheel.read(provider_config_path(sandbox).as_posix())
        except KeyError:
            return {}
    block: dict[str, Any] = yaml.safe_load(text)["sandbox"][sandbox]
    return block


def _env_line(name: str, path: str) -> str:
    return f"{name} (environment variable read by {path}; or set {path} in --provider-config)"


MISSING_ON_A_BARE_HOST = {
    "docker": ["docker binary on PATH (the docker provider runs it)"],
    "daytona": [_env_line("DAYTONA_API_KEY", "sandbox.daytona.connection.api_key")],
    "e2b": [
        "E2B_API_KEY (environment variable; or sandbox.e2b.connection.api_key, or connection.api_headers "
        "for a gateway, in --provider-config)"
    ],
    "ecs_fargate": [
        _env_line("AWS_REGION", "sandbox.ecs_fargate.region"),
        "AWS credentials (AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or ~/.aws/credentials; "
        "an EC2 instance role also works, which a dry run cannot see)",
    ],
    "opensandbox": [_env_line("OPENSANDBOX_API_KEY", "sandbox.opensandbox.connection.api_key")],
    "openshell": [],
    "enroot": ["enroot binary on PATH (the enroot provider runs it)"],
    "apptainer": ["apptainer binary on PATH (the apptainer provider runs it)"],
    "local": [],
}


def test_every_provider_nemo_gym_registers_is_covered() -> None:
    assert sorted(MISSING_ON_A_BARE_HOST) == sorted(SANDBOXES)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_dry_run_prints_the_config_and_exactly_what_is_missing(sandbox: str, bare_host: Path) -> None:
    result, config, missing = _dry_run(sandbox)
    assert missing == MISSING_ON_A_BARE_HOST[sandbox], result.stderr
    assert result.exit_code == (1 if missing else 0)
    agent = config[SERVER_NAME]["responses_api_agents"][SERVER_NAME]
    assert (agent["port"], agent["sandbox_provider"]) == (23456, "sandbox")
    assert agent["step_limit"] == 250  # from serve's options, not the shipped agent config
    shipped = _shipped(sandbox)
    if sandbox == "local":
        shipped["workspace_root"] = "<state-dir>/workspaces"
    assert config["sandbox"][sandbox] == shipped
    assert config["results_dir"] == "<state-dir>/results"
    assert "ray_head_node_address" not in config
    # Nothing was built or started: the server venv folder does not even exist.
    assert not (bare_host / "gym-venv").exists()


def test_what_the_host_provides_is_not_missing_and_no_secret_is_printed(
    bare_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAYTONA_API_KEY", "dtn-env-secret-value")
    result, config, missing = _dry_run("daytona")
    assert (result.exit_code, missing) == (0, [])
    assert "dtn-env-secret-value" not in result.output
    assert config["sandbox"]["daytona"]["connection"]["api_key"] == "${oc.env:DAYTONA_API_KEY}"


def test_a_key_given_in_provider_options_counts_and_is_hidden(bare_host: Path, tmp_path: Path) -> None:
    options = tmp_path / "e2b.yaml"
    options.write_text("connection:\n  api_key: e2b-literal-secret\n  api_headers: {Authorization: Bearer tok-9}\n")
    result, config, missing = _dry_run("e2b", "--provider-config", str(options))
    assert (result.exit_code, missing) == (0, [])
    assert "e2b-literal-secret" not in result.output
    assert "tok-9" not in result.output
    connection = config["sandbox"]["e2b"]["connection"]
    assert connection["api_key"] == "***"
    assert connection["api_headers"] == {"Authorization": "***"}
    assert connection["request_timeout_s"] == _shipped("e2b")["connection"]["request_timeout_s"]


def test_aws_credentials_from_a_credentials_file(
    bare_host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    credentials = tmp_path / "home" / ".aws" / "credentials"
    credentials.parent.mkdir(parents=True)
    credentials.write_text("[default]\naws_access_key_id = AKIAEXAMPLE\n")
    result, _, missing = _dry_run("ecs_fargate")
    assert (result.exit_code, missing) == (0, [])


def test_docker_needs_its_daemon_not_just_the_cli(bare_host: Path, tmp_path: Path) -> None:
    docker = shell_script(tmp_path / "bin" / "docker", "echo 'Cannot connect to the Docker daemon' >&2; exit 1")
    result, _, missing = _dry_run("docker")
    assert missing == [f"a running Docker daemon ({docker} version: Cannot connect to the Docker daemon)"]
    shell_script(docker, "echo 28.2.2")
    result, _, missing = _dry_run("docker")
    assert (result.exit_code, missing) == (0, [])


def test_no_python_to_build_the_server_environment_is_missing(
    bare_host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MILES_NEMOGYM_GYM_PYTHON", str(tmp_path / "nowhere" / "python3.13"))
    result, _, missing = _dry_run("local")
    assert result.exit_code == 1
    assert len(missing) == 1
    assert missing[0].startswith(f"MILES_NEMOGYM_GYM_PYTHON={tmp_path / 'nowhere' / 'python3.13'} does not run")


def test_the_ray_address_reaches_the_config(bare_host: Path) -> None:
    with socket.socket() as head:  # where a cluster's head would listen
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"127.0.0.1:{head.getsockname()[1]}"
        result, config, missing = _dry_run("local", "--ray-address", address)
    assert (result.exit_code, missing) == (0, [])
    assert config["ray_head_node_address"] == address
    assert f"Ray: joins {address}" in result.stderr


def test_a_ray_address_where_nothing_listens_is_missing(bare_host: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    result, _, missing = _dry_run("local", "--ray-address", address)
    assert result.exit_code == 1
    assert missing == [f"a Ray cluster at {address} (cannot connect: Connection refused)"]


def test_provider_options_for_another_provider_exit_2_with_the_fix(bare_host: Path, tmp_path: Path) -> None:
    options = tmp_path / "provider.yaml"
    options.write_text("sandbox:\n  daytona: {}\n")
    result = CliRunner().invoke(app, ["serve", "--sandbox", "docker", "--dry-run", "--provider-config", str(options)])
    assert result.exit_code == 2
    assert "put its options under `sandbox.docker`" in result.stderr
    assert result.stdout == ""


def test_agent_config_comes_from_the_wheel(bare_host: Path) -> None:
    with zipfile.ZipFile(wheel_path()) as wheel:
        shipped = yaml.safe_load(wheel.read(AGENT_CONFIG.as_posix()))[SERVER_NAME]["responses_api_agents"][SERVER_NAME]
    _, config, _ = _dry_run("docker")
    agent = config[SERVER_NAME]["responses_api_agents"][SERVER_NAME]
    assert agent["sandbox_spec"] == shipped["sandbox_spec"]
    assert agent["sandbox_environment_kwargs"] == shipped["sandbox_environment_kwargs"]


def _environments_printed(stderr: str) -> tuple[list[str], str]:
    """The environment lines and the ``NEMO_GYM_ENVS`` value a dry run printed."""
    lines = stderr.splitlines()
    start = lines.index("environments (each a resources server run from the server environment):")
    servers = [line.strip() for line in lines[start + 1 :] if line.startswith("  ") and not line.startswith("  - ")]
    setting = next(line for line in lines if line.startswith("NEMO_GYM_ENVS="))
    return servers, setting.removeprefix("NEMO_GYM_ENVS=").strip("'")


def test_dry_run_with_environments_shows_servers_ports_requirements_and_the_setting(bare_host: Path) -> None:
    result, config, missing = _dry_run("local", "--env", "math_with_judge", "--env", "workplace_assistant")
    assert (result.exit_code, missing) == (0, [])
    assert config[SERVER_NAME]["responses_api_agents"][SERVER_NAME]["port"] == 23456  # SWE as without --env
    servers, setting = _environments_printed(result.stderr)
    assert servers == [
        "math_with_judge: server math_with_judge from resources_servers/math_with_judge/configs/math_with_judge.yaml, "
        "on port 23457",
        "workplace_assistant: server workplace_assistant from "
        "resources_servers/workplace_assistant/configs/workplace_assistant.yaml, on port 23458, max_steps 6",
    ]
    assert (
        "requirements: datasets, math-verify==0.8.0; the ones the server environment lacks are installed on the "
        "first serve" in result.stderr
    )
    environments = Settings.from_env({"NEMO_GYM_ENVS": setting}).environments
    assert environments["math_with_judge"].url == "http://127.0.0.1:23457"
    assert (environments["workplace_assistant"].url, environments["workplace_assistant"].max_steps) == (
        "http://127.0.0.1:23458",
        6,
    )
    assert not (bare_host / "gym-venv").exists()


def test_dry_run_of_environments_only_starts_them_from_the_port(bare_host: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--no-swe", "--env", "xlam_fc", "--port", "23456", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # no SWE server config
    servers, setting = _environments_printed(result.stderr)
    assert servers == ["xlam_fc: server xlam_fc from resources_servers/xlam_fc/configs/xlam_fc.yaml, on port 23456"]
    assert "requirements: none beyond nemo-gym" in result.stderr
    assert "nothing missing for the environments." in result.stderr
    assert json.loads(setting) == {"xlam_fc": "http://127.0.0.1:23456"}


@pytest.mark.parametrize("sandbox", ["docker", "daytona"])
def test_serve_refuses_a_provider_that_lacks_what_dry_run_names_before_starting(
    sandbox: str, bare_host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if sandbox == "docker":
        shell_script(tmp_path / "bin" / "docker", "echo 'Cannot connect to the Docker daemon' >&2; exit 1")
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # TMPDIR is read once per process
    _, _, said = _dry_run(sandbox)
    refused = CliRunner().invoke(app, ["serve", "--sandbox", sandbox, "--port", "23456"])
    assert refused.exit_code == 1, refused.output
    assert f"error: the {sandbox} sandbox cannot run episodes here; it lacks:" in refused.stderr
    assert [line[4:] for line in refused.stderr.splitlines() if line.startswith("  - ")] == said != []
    assert "pass --start-anyway" in refused.stderr and "Nothing was started." in refused.stderr
    assert "serving" not in refused.output and not (bare_host / "gym-venv").exists()
    # --start-anyway goes on to the server environment (here its stand-in Python cannot build it).
    started = CliRunner().invoke(app, ["serve", "--sandbox", sandbox, "--port", "23456", "--start-anyway"])
    assert started.exit_code == 1 and "lacks" not in started.stderr, started.output
    assert isinstance(started.exception, SystemExit) and "Traceback" not in started.output, started.output
    assert "error: pip install of nemo-gym's requirements could not run" in started.stderr, started.stderr
    assert list(temp.iterdir()) == []  # serve's own state folder held nothing: removed


def test_dry_run_of_a_gymnasium_environment_names_its_agent_and_the_setting_carries_it(bare_host: Path) -> None:
    lacking = CliRunner().invoke(app, ["serve", "--no-swe", "--env", "blackjack", "--dry-run"])
    assert lacking.exit_code == 1, lacking.output  # what serve would refuse, the dry run lists
    assert "  - --session-server HOST:PORT: blackjack is played by an agent server" in lacking.stderr
    given = ["--session-server", "10.0.0.5:30000"]
    result = CliRunner().invoke(
        app, ["serve", "--no-swe", "--env", "blackjack", "--port", "23456", *given, "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    servers, setting = _environments_printed(result.stderr)
    assert (
        servers[0]
        == "blackjack: server blackjack from resources_servers/blackjack/configs/blackjack.yaml, on port 23456"
    )
    assert (
        "played by agent blackjack_gymnasium_agent (its /run), model calls through the routing model" in result.stderr
    )
    entry = json.loads(setting)["blackjack"]
    assert (entry["url"], entry["reward_range"]) == ("http://127.0.0.1:23456", [-1.0, 1.0]) and "agent" in entry


def test_serving_an_agent_environment_needs_the_trainers_session_servers(bare_host: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--no-swe", "--env", "blackjack"])
    assert result.exit_code == 2
    assert "blackjack is played by an agent server" in result.stderr and "--session-server HOST:PORT" in result.stderr
    assert not (bare_host / "gym-venv").exists()  # refused before anything was built or started
    for entry in ("h:x", "10.0.0.5", "10.0.0.5:", "10.0.0.5:0", "10.0.0.5:30007-30000", "u@10.0.0.5:30000"):
        bad = CliRunner().invoke(app, ["serve", "--no-swe", "--env", "blackjack", "--session-server", entry])
        assert bad.exit_code == 2 and f"--session-server {entry!r}: " in bad.stderr, (entry, bad.stderr)
        assert "give HOST:PORT (e.g. 10.0.0.5:30000), or a range HOST:PORT-PORT" in bad.stderr
        assert not (bare_host / "gym-venv").exists()


def test_a_session_server_names_its_port_or_an_explicit_range(bare_host: Path) -> None:
    """``HOST`` alone allowed every port of the host (an open relay carrying the policy key):
    refused, naming the fix; the help shows the required form."""
    alone = CliRunner().invoke(app, ["serve", "--no-swe", "--env", "blackjack", "--session-server", "10.0.0.5"])
    assert alone.exit_code == 2 and "give HOST:PORT (e.g. 10.0.0.5:30000)" in alone.stderr, alone.stderr
    for entry in ("10.0.0.5:30000", "10.0.0.5:30000-30007", "[::1]:30000", "trainer-0:30000"):
        given = ["serve", "--no-swe", "--env", "blackjack", "--session-server", entry, "--dry-run"]
        assert CliRunner().invoke(app, given).exit_code == 0, entry
    shown = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    assert "HOST:PORT" in shown and "HOST[:PORT]" not in shown and "HOST alone" not in shown


def test_a_rollout_secret_the_user_gives_serve_must_be_long_enough(bare_host: Path) -> None:
    given = ["serve", "--no-swe", "--env", "blackjack", "--session-server", "10.0.0.5:30000"]
    result = CliRunner().invoke(app, given, env={"NEMO_GYM_ROLLOUT_SECRET": "hunter2"})
    assert result.exit_code == 2 and "NEMO_GYM_ROLLOUT_SECRET is shorter than 32 characters" in result.stderr
    assert "hunter2" not in result.output and not (bare_host / "gym-venv").exists()


def test_routed_plays_a_simple_agent_environment_through_its_own_run(bare_host: Path) -> None:
    routed = ["serve", "--no-swe", "--env", "mcqa", "--routed", "--session-server", "10.0.0.5:30000", "--dry-run"]
    result = CliRunner().invoke(app, routed)
    assert result.exit_code == 0, result.output
    assert "played by agent mcqa_simple_agent (its /run)" in result.stderr
    assert "agent" in json.loads(_environments_printed(result.stderr)[1])["mcqa"]


@pytest.mark.parametrize(("given", "busy"), [(["--sandbox", "local"], 0), (["--sandbox", "local", "--env", "mcqa"], 1)])
def test_a_taken_port_is_refused_before_anything_starts(bare_host: Path, given: list[str], busy: int) -> None:
    # A second serve on a running serve's SWE port said Ready (its health check reached the first one).
    port = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port + busy))
        listener.listen()
        result = CliRunner().invoke(app, ["serve", *given, "--port", str(port)])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    taken = re.search(r"--port: ([\d, ]+) on 127\.0\.0\.1 (?:is|are) taken", said)
    assert taken and str(port + busy) in taken.group(1).split(", ") and "Nothing was started." in said
    assert "Ready" not in said and not (bare_host / "gym-venv").exists()


def test_serve_refuses_an_environment_that_lacks_what_dry_run_names_before_starting(
    bare_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # litmus_agent's resources server runs its tools in the OpenSandbox service its config connects to
    # (${oc.env:OPENSANDBOX_DOMAIN,<a cluster's address>}): serve started it without one, said Ready,
    # and no episode could run; --dry-run already named what it lacks.
    need = "the sandbox service its config connects to (opensandbox): set OPENSANDBOX_API_KEY, OPENSANDBOX_DOMAIN"
    dry = CliRunner().invoke(app, ["serve", "--no-swe", "--env", "litmus_agent", "--dry-run"])
    assert dry.exit_code == 1 and need in dry.output, dry.output
    refused = CliRunner().invoke(app, ["serve", "--no-swe", "--env", "litmus_agent", "--port", "23456"])
    assert refused.exit_code == 1, refused.output
    assert "error: the environments' servers cannot run here; they lack:" in refused.stderr
    lacking = [line[4:] for line in refused.stderr.splitlines() if line.startswith("  - ")]
    assert lacking and all(line.startswith("litmus_agent: ") for line in lacking), lacking
    assert need in " ".join(lacking)
    assert "pass --start-anyway" in refused.stderr and "Nothing was started." in refused.stderr
    assert not (bare_host / "gym-venv").exists()
    monkeypatch.setenv("OPENSANDBOX_DOMAIN", "sandboxes.example:8080")  # the user's service: nothing lacks
    monkeypatch.setenv("OPENSANDBOX_API_KEY", "")
    given = CliRunner().invoke(app, ["serve", "--no-swe", "--env", "litmus_agent", "--dry-run"])
    assert given.exit_code == 0 and "nothing missing" in given.output, given.output
    started = CliRunner().invoke(
        app, ["serve", "--no-swe", "--env", "litmus_agent", "--port", "23456", "--start-anyway"]
    )
    assert started.exit_code == 1 and "they lack" not in started.stderr, started.output
