"""``serve --env``: which environments exist, their configs and requirements as the wheel ships
them, the flags, and the overlay venv their extra requirements go into."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.gym import server as gym_server
from miles_nemogym.gym.environments import (
    EnvironmentPlan,
    EnvironmentServers,
    environment_python,
    overlay_path,
    plan,
)
from miles_nemogym.gym.venv import GymEnvironmentError, GymVenv
from tests.support.ports import free_port, port_in_time_wait
from tests.support.ray_cluster import pids_with_environment
from tests.support.wheels import tiny_wheel


def _by_name(*names: str) -> dict[str, EnvironmentPlan]:
    return {p.name: p for p in plan(list(names))}


def test_each_environment_is_planned_from_its_shipped_config_and_requirements() -> None:
    plans = _by_name("math_with_judge", "code_gen", "xlam_fc", "equivalence_rule", "workplace_assistant", "arc_agi")
    assert plans["math_with_judge"].requirements == ("math-verify==0.8.0", "datasets")
    assert plans["code_gen"].requirements == ("numpy==2.2.6",)
    assert plans["xlam_fc"].requirements == ()
    assert plans["arc_agi"].requirements == ()  # `-e ../../` is nemo-gym itself
    # The config named after the environment, else its only one, whose instance may be named otherwise.
    assert plans["xlam_fc"].config == "resources_servers/xlam_fc/configs/xlam_fc.yaml"
    assert (plans["equivalence_rule"].config, plans["equivalence_rule"].instance) == (
        "resources_servers/equivalence_rule/configs/lc.yaml",
        "lc_equivalence_rule",
    )
    # max_steps of the simple_agent paired with it, where the config sets one.
    assert plans["workplace_assistant"].max_steps == 6
    assert plans["xlam_fc"].max_steps is None


def test_a_name_given_twice_is_served_once() -> None:
    assert [p.name for p in plan(["mcqa", "xlam_fc", "mcqa"])] == ["mcqa", "xlam_fc"]


def test_the_name_rows_carry_in_agent_ref_picks_its_config() -> None:
    """NeMo-Gym's prepared rows name ``X_simple_agent``; X may differ from the folder."""
    plans = _by_name("lc_equivalence_rule", "lmarena_v2", "structured_outputs_v3")
    assert (plans["lc_equivalence_rule"].config, plans["lc_equivalence_rule"].instance) == (
        "resources_servers/equivalence_rule/configs/lc.yaml",
        "lc_equivalence_rule",
    )
    assert plans["lmarena_v2"].config == "resources_servers/arena/configs/lmarena_v2.yaml"
    assert plans["structured_outputs_v3"].instance == "structured_outputs"  # its agent's resources server
    assert plans["structured_outputs_v3"].requirements == (
        "openapi-schema-validator==0.6.3",
        "tomli-w==1.2.0",
        "xmltodict==1.0.2",
    )


def test_two_names_for_one_server_instance_are_refused() -> None:
    with pytest.raises(GymEnvironmentError, match="'equivalence_rule' and 'lc_equivalence_rule' are both served"):
        plan(["equivalence_rule", "lc_equivalence_rule"])


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ("instruction_following", "git+https://github.com/abukharin-nv/verifiable-instructions.git"),
        ("aviary", "hypotest @ git+https://github.com/EdisonScientific/hypotest.git"),
        ("browsecomp_advanced_harness", "-e ./pocketshell[pcre]"),
    ],
)
def test_a_requirement_beyond_pypi_is_refused_naming_the_environment_and_line(env: str, line: str) -> None:
    with pytest.raises(GymEnvironmentError) as caught:
        plan([env])
    assert f"environment {env!r}: its requirements.txt line '{line}" in str(caught.value)


def test_several_configs_none_named_after_the_environment_are_named_in_the_refusal() -> None:
    with pytest.raises(GymEnvironmentError, match=r"'arena'.* 2 configs .*\(lmarena_v2.yaml, lmarena_v3.yaml\)"):
        plan(["arena"])


def _serve(*arguments: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["serve", *arguments])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, " ".join(result.stderr.split())  # rich wraps long lines


def test_an_unknown_environment_exits_2_with_close_matches() -> None:
    code, said = _serve("--sandbox", "local", "--env", "mcqq", "--env", "xlam_fc")
    assert code == 2
    assert "error: --env: 'mcqq' is not an environment nemo-gym ships (did you mean mcqa" in said


def test_an_environment_with_several_configs_is_refused_with_the_names_to_give_instead() -> None:
    code, said = _serve("--sandbox", "local", "--env", "arena")
    assert code == 2
    fix = "give one by its catalog name (or its last part): "
    assert f"{fix}resources_servers/arena/lmarena_v2, resources_servers/arena/lmarena_v3" in said


def test_a_name_in_another_case_is_suggested() -> None:
    code, said = _serve("--sandbox", "local", "--env", "MCQA")
    assert code == 2
    assert "'MCQA' is not an environment nemo-gym ships (did you mean mcqa," in said


def test_an_environment_needing_network_exits_2_before_anything_starts() -> None:
    code, said = _serve("--sandbox", "local", "--env", "instruction_following")
    assert code == 2
    assert "'git+https://github.com/abukharin-nv/verifiable-instructions.git' needs more than PyPI" in said


def test_no_swe_needs_an_environment() -> None:
    code, said = _serve("--no-swe")
    assert code == 2
    assert "--no-swe serves only the --env environments; name one, e.g. --env mcqa" in said


def test_environment_ports_follow_the_swe_port_and_must_exist() -> None:
    code, said = _serve("--sandbox", "local", "--port", "65534", "--env", "mcqa", "--env", "xlam_fc")
    assert code == 2
    assert "--port: 2 environments after port 65534 pass 65535" in said


# ----------------------------------------------------------------------------- overlay venv


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees only ``tmp_path/wheels`` (an empty index, no config file); the cache is in ``tmp_path``."""
    (tmp_path / "empty-index").mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "empty-index").as_uri())
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(tmp_path / "cache"))
    tiny_wheel(tmp_path / "wheels", "mng_overlay_probe", "1.0")
    return tmp_path / "wheels"


def _base() -> GymVenv:
    """This test's interpreter standing in for the server venv (it has ``packaging`` and pydantic)."""
    return GymVenv(Path(sys.prefix), Path(sys.executable), Path(sysconfig.get_path("purelib")))


def _env(name: str, *requirements: str) -> EnvironmentPlan:
    return EnvironmentPlan(name, f"resources_servers/{name}/configs/{name}.yaml", name, requirements, None)


def _where(python: Path, module: str) -> str:
    code = f"import {module}; print({module}.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, env=env).stdout.strip()


def test_extra_requirements_go_into_an_overlay_cached_by_their_set(local_index: Path) -> None:
    base = _base()
    plans = [_env("a", "mng-overlay-probe==1.0", "pydantic"), _env("b", "pydantic")]
    python = environment_python(base, plans, progress=lambda line: None)
    overlay = overlay_path(base, ["mng-overlay-probe==1.0"])  # pydantic is in the base: not part of the key
    assert python == overlay / "bin" / "python"
    assert _where(python, "mng_overlay_probe").startswith(str(overlay))
    # The base's packages are seen where they are, not copied.
    assert _where(python, "pydantic").startswith(str(base.site_packages))
    # Cached: the same set in another order, with nothing left to install from, is the same venv.
    for wheel in local_index.iterdir():
        wheel.unlink()
    again = environment_python(base, [_env("b", "pydantic"), _env("a", "mng-overlay-probe==1.0")], lambda _: None)
    assert again == python


def test_environments_the_base_satisfies_run_in_it_as_is(local_index: Path) -> None:
    base = _base()
    assert environment_python(base, [_env("a", "pydantic"), _env("b")], progress=lambda line: None) == base.python
    assert not (local_index.parent / "cache").exists()


# ----------------------------------------------------------------------------- what a server inherits

# A resources server stand-in: records the names in its environment, then answers on its port.
_ENVIRON_PROBE = """
import json, os
from http.server import BaseHTTPRequestHandler, HTTPServer

import yaml

name = os.environ["NEMO_GYM_CONFIG_PATH"]
block = yaml.safe_load(os.environ["NEMO_GYM_CONFIG_DICT"])[name]["resources_servers"]["probe"]
with open(f"{name}.environ.json", "w") as out:
    json.dump(sorted(os.environ), out)
echo = os.environ.get("MNG_PROBE_ECHO")  # an upstream's error echoing a key, as a server prints it
if echo:
    print("x" * ((1 << 20) - 3) + echo)  # one long line, the key across the reader's chunks
    escaped = "".join(chr(92) + f"u{ord(c):04x}" for c in echo[:4]) + echo[4:]
    print('401 from upstream: {"error": "bad key ' + escaped + '"}')
    print("no newline before exit: " + echo, end="", flush=True)


class Answer(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


HTTPServer((block["host"], block["port"]), Answer).serve_forever()
"""


def test_no_environment_server_gets_the_policy_api_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # mcqa's and xlam_fc's /proc/<pid>/environ held NEMO_GYM_POLICY_API_KEY; no server needs it.
    key = f"sk-policy-{uuid.uuid4().hex}"
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", key)
    monkeypatch.setenv("MNG_PROBE_INHERITED", "1")
    servers = _probes(tmp_path, "probe")
    try:
        servers.start()
        # Written relative to its working directory: the server's own folder, as nemo-gym runs it.
        inherited = json.loads((tmp_path / "probe" / "probe.environ.json").read_text())
        assert "MNG_PROBE_INHERITED" in inherited  # the rest of the caller's environment is passed on
        assert "NEMO_GYM_POLICY_API_KEY" not in inherited
        assert pids_with_environment(key) == []
    finally:
        servers.stop()


def _probe_servers(tmp_path: Path, first_port: int) -> EnvironmentServers:
    app = tmp_path / "probe" / "app.py"
    app.parent.mkdir(exist_ok=True)
    app.write_text(_ENVIRON_PROBE)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    servers = EnvironmentServers(
        _base(),
        [_env("probe")],
        state_dir=state,
        first_port=first_port,
        app_folders={"probe": app.parent},
        progress=lambda line: None,
    )
    servers.config = {"probe": {"resources_servers": {"probe": {}}}}  # composed already: no parser run
    return servers


def test_a_port_in_time_wait_is_free_and_a_listening_one_is_taken(tmp_path: Path) -> None:
    # A restarted serve could not take its port for ~60 s: the check bound without SO_REUSEADDR.
    port = port_in_time_wait()
    servers = _probe_servers(tmp_path, port)
    try:
        servers.start()
        assert servers.ports["probe"] == port
        again = _probe_servers(tmp_path, port)  # the port is now really listening
        with pytest.raises(GymEnvironmentError, match=f"port {port} on 127.0.0.1 .* is taken"):
            again.start()
    finally:
        servers.stop()


class _Picks:
    """Stands in for ``gym.server``'s random pick: hands out ``ports`` in turn, the last one forever."""

    def __init__(self, *ports: int) -> None:
        self.ports = list(ports)

    def choice(self, _: range) -> int:
        return self.ports.pop(0) if len(self.ports) > 1 else self.ports[0]


def _probes(tmp_path: Path, *names: str) -> EnvironmentServers:
    app = tmp_path / "probe" / "app.py"
    app.parent.mkdir()
    app.write_text(_ENVIRON_PROBE)
    state = tmp_path / "state"
    state.mkdir()
    servers = EnvironmentServers(
        _base(),
        [_env(name) for name in names],
        state_dir=state,
        app_folders=dict.fromkeys(names, app.parent),
        progress=lambda line: None,
    )
    servers.config = {name: {"resources_servers": {"probe": {}}} for name in names}  # composed already
    return servers


def test_one_start_never_hands_out_a_free_port_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CI: mcqa failed with "[Errno 98] address already in use" starting 12 servers: each free port
    # was picked alone, none bound until spawn, so two servers of one start could get the same one.
    monkeypatch.setattr(gym_server, "_pick", _Picks(free_port()))  # every pick the same free port
    servers = _probes(tmp_path, "a", "b", "c")
    try:
        servers.start()
        assert len(set(servers.ports.values())) == 3, servers.ports
    finally:
        servers.stop()


def test_a_free_port_taken_before_its_server_binds_it_starts_again_on_fresh_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another program binds the picked port between the check and the bind. Bound, not listening: a
    # listener that never accepts would hold serve's readiness probe for its whole 5 s read timeout.
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        taken, fresh = other.getsockname()[1], free_port()
        monkeypatch.setattr(gym_server, "_pick", _Picks(taken, fresh))
        monkeypatch.setattr(gym_server, "port_free", lambda host, port: True)
        servers = _probes(tmp_path, "a")
        try:
            servers.start()
            assert servers.ports == {"a": fresh}
            assert "address already in use" in servers.log_tail("a").lower()  # the first start's failure
        finally:
            servers.stop()


def test_server_logs_are_private_scrubbed_of_keys_and_never_written_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A key an upstream echoed reached serve's logs verbatim, 0644, through a planted link.
    policy, judge = f"sk-policy-{uuid.uuid4().hex}", f"sk-judge-{uuid.uuid4().hex}"
    monkeypatch.setenv("NEMO_GYM_POLICY_API_KEY", policy)
    monkeypatch.setenv("NEMO_GYM_JUDGE_API_KEY", judge)
    for key in (policy, judge):
        monkeypatch.setenv("MNG_PROBE_ECHO", key)
        servers = _probe_servers(tmp_path, 0)
        try:
            servers.start()
        finally:
            servers.stop()  # the log is complete once its server is gone
        log = servers.log_path("probe")
        data = log.read_bytes()
        assert key.encode() not in data and key[4:].encode() not in data
        assert data.count(b"***") == 3 and data.endswith(b"no newline before exit: ***")
        assert len(data) > 1 << 20  # nothing but the key was taken out
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        log.unlink()

    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    log.symlink_to(precious)
    planted = _probe_servers(tmp_path, 0)
    with pytest.raises(GymEnvironmentError, match=f"log {log} is a symbolic link"):
        planted.start()
    planted.stop()
    assert precious.read_text() == "keep me\n" and stat.S_IMODE(precious.stat().st_mode) != 0o600


def test_a_harness_environment_this_package_does_not_run_exits_2_naming_what_it_lacks() -> None:
    code, said = _serve("--no-swe", "--env", "codex_math", "--session-server", "127.0.0.1:8000")
    assert code == 2
    assert (
        "environment 'codex_math': its agent codex_agent: its CLI (npm `@openai/codex` 0.144.4) sends `include`" in said
    )


def test_the_opencode_cli_needs_npm_until_it_is_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from miles_nemogym.gym.wheel import cache_dir

    cache = tmp_path / "cache"
    (cache / "wheels").parent.mkdir()
    (cache / "wheels").symlink_to(cache_dir() / "wheels")  # the pinned wheel; no npm install cached
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(cache))
    monkeypatch.setenv("PATH", str(tmp_path / "no-npm-here"))
    dry_run = ("--no-swe", "--env", "opencode_math", "--session-server", "127.0.0.1:8000", "--dry-run")
    code, said = _serve(*dry_run)
    need = "opencode_math_agent (opencode_agent): npm and npm's registry, to install opencode-ai@1.17.11 once"
    assert code == 1 and need in said, said
    installed = cache / "npm" / "opencode-ai-1.17.11" / "node_modules" / ".bin" / "opencode"
    installed.parent.mkdir(parents=True)
    installed.touch()
    code, said = _serve(*dry_run)
    assert "npm" not in said, said
