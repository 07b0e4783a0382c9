"""NeMo-Gym resources servers (``mcqa``, ``xlam_fc``, ...) started from the cached server venv
(why and what it costs: docs/environments.md, "Serving environments")."""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import hashlib
import json
import os
import posixpath
import re
import secrets
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from miles_nemogym.episode.record import AGENT_SUFFIX
from miles_nemogym.errors import counted
from miles_nemogym.gym import wheel as gym_wheel
from miles_nemogym.gym._harness import HARNESSES, cli_bin
from miles_nemogym.gym._judge_gate import JudgeGate
from miles_nemogym.gym._logs import ServerLog, log_tail, run_secrets
from miles_nemogym.gym.composition import (
    JUDGE_INSTANCE,
    JUDGE_KEY_ENV,
    POLICY_KEY_ENV,
    POLICY_MODEL,
    Judge,
    config_needs,
    grader_settings,
    inherited_config,
    layer,
    own_config,
    refusal,
    served,
    server_blocks,
    shipped_config,
)
from miles_nemogym.gym.config import MODEL_CONFIG, PLACEHOLDER_POLICY_URL, parse_config
from miles_nemogym.gym.server import (
    MARKER_ENV,
    advertised_url,
    free_port,
    port_free,
    spawn,
    terminate,
    wait_until_answering,
)
from miles_nemogym.gym.venv import (
    BuildLines,
    GymEnvironmentError,
    GymVenv,
    Progress,
    build_once,
    child_environment,
    gym_venv_root,
    run_build_step,
    run_in_gym,
)
from miles_nemogym.routing_root.responses_api_models.miles_routing_model.routing_contract import SECRET_VARIABLE
from miles_nemogym.settings import environment_name_problem, short_name
from miles_nemogym.transport import connect_host
from miles_nemogym.yaml_file import load as load_yaml

__all__ = ["EnvironmentPlan", "EnvironmentServers", "check_shipped", "plan", "refusals", "shipped_examples"]

_T = TypeVar("_T")
_GROUP = "resources_servers"
_CATALOG = "environments"
_BENCHMARKS = "benchmarks"
BENCHMARK_SUFFIX = ".benchmark"
"""Added to a benchmark's environment name that an environment already has (``aalcr.benchmark``)."""
PLAYED_AGENTS = ("simple_agent", "gymnasium_agent", *HARNESSES)
"""The agent kinds of an ``environments/`` folder this package serves by the folder's name."""
_READY = "miles-nemogym-envs.json"
# A plain PyPI requirement: a name, optional extras, version specifiers and an environment marker.
_PYPI_LINE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\s*(\[[A-Za-z0-9._,\s-]*\])?\s*([<>=!~][^;@]*)?(;[^@]*)?")

# Runs in the server venv: which requirement lines its installed distributions already satisfy.
_SATISFIED = """
import json, sys
from importlib.metadata import PackageNotFoundError, version
from packaging.requirements import Requirement
out = []
for line in json.loads(sys.argv[1]):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate():
        out.append(True)
        continue
    try:
        out.append(not req.extras and req.specifier.contains(version(req.name), prereleases=True))
    except PackageNotFoundError:
        out.append(False)
print("\\n" + json.dumps(out))
"""


ROUTING_ROOT = Path(__file__).parent.parent / "routing_root"
"""A ``NEMO_GYM_EXTRA_ROOTS`` root holding this package's routing model server."""
ROUTING_MODEL = ROUTING_ROOT / "responses_api_models" / "miles_routing_model"
_ROUTING_CONFIG = ROUTING_MODEL / "configs" / "miles_routing_model.yaml"
# The least token capture under which every agent prefixes its model calls with the rollout id (nemo-gym
# 0.7.0, base_responses_api_agent.py); it writes nothing anywhere (docs/environments.md, "Routed agents").
_ROLLOUT_ID_SETTING = {"token_id_capture": {"enabled": True, "all_agents": True, "rebuild_response": False}}
_REWARD_RANGES = {"blackjack": (-1.0, 1.0)}  # +1 win, 0 draw, -1 loss: the wheel states no range a program reads


class UnknownEnvironmentError(GymEnvironmentError):
    """An environment name the pinned nemo-gym does not ship: each with its close matches, one line."""


@dataclass(frozen=True)
class EnvironmentPlan:
    """One environment as the wheel ships it."""

    name: str
    config: str
    """The config file, relative to site-packages."""
    instance: str
    """The config's top-level key holding the resources server (its ``NEMO_GYM_CONFIG_PATH``)."""
    requirements: tuple[str, ...]
    """``requirements.txt`` lines beyond nemo-gym itself."""
    max_steps: int | None
    """``max_steps`` of the ``simple_agent`` the config pairs with it, if set."""
    agent: str | None = None
    """The agent instance whose ``/run`` plays its rows; None: the in-process ``simple_agent`` loop."""
    reward_range: tuple[float, float] | None = None
    """Its valid rewards when they are not ``[0, 1]`` (``_REWARD_RANGES``)."""

    @property
    def resources_server(self) -> str:
        """Its resources server's folder of ``resources_servers/`` in the wheel (its app, requirements)."""
        if self.config.startswith(f"{_GROUP}/"):
            return self.config.split("/")[1]
        return str(next(iter(shipped_config(self.config)[self.instance][_GROUP])))

    @property
    def rows(self) -> str:
        """Its example rows' member of the wheel."""
        parts = self.config.split("/")
        if len(parts) == 4 and parts[0] == _GROUP and parts[3] != f"{parts[1]}.yaml":
            return _config_rows(self.config)
        return _rows_of(self.config)

    def rows_text(self) -> str | None:
        """Its example rows as the wheel ships them (:attr:`rows`; None: it ships none)."""
        return gym_wheel.read_member(self.rows).decode("utf-8") if gym_wheel.ships(self.rows) else None


def _rows_of(config: str) -> str:
    """``<group>/X/data/example.jsonl`` for a config under ``<group>/X/``."""
    return "/".join([*config.split("/")[:2], "data", "example.jsonl"])


def _per_wheel(read: Callable[[], _T]) -> Callable[[], _T]:
    """``read()`` kept per pinned wheel (its path keys the cache), each caller given its own copy."""
    kept = functools.lru_cache(maxsize=4)(lambda wheel: read())

    @functools.wraps(read)
    def per_wheel() -> _T:
        return copy.copy(kept(gym_wheel.wheel_path()))

    per_wheel.cache_clear = kept.cache_clear  # type: ignore[attr-defined]
    return per_wheel


@_per_wheel
def shipped_environments() -> list[str]:
    """Every resources server the pinned wheel ships (a ``resources_servers/<name>/app.py``)."""
    with gym_wheel.opened() as archive:
        return sorted({m.split("/")[1] for m in archive.namelist() if re.fullmatch(rf"{_GROUP}/[^/]*/app\.py", m)})


def _folder_configs() -> list[tuple[str, dict[str, Any]]]:
    """Each ``environments/<name>/config.yaml`` of the wheel, with its mapping (``{}`` if it is none)."""
    with gym_wheel.opened() as archive:
        names = sorted(archive.namelist())
    configs = [m for m in names if m.count("/") == 2 and m.startswith(f"{_CATALOG}/") and m.endswith("/config.yaml")]
    return [(member, own_config(member)) for member in configs]


@_per_wheel
def catalog_folders() -> dict[str, str]:
    """Each ``environments/`` folder pairing one resources server with ``PLAYED_AGENTS``: name -> its config."""
    found: dict[str, str] = {}
    for member, config in _folder_configs():
        blocks = list(server_blocks(config))
        agents = {kind for _, group, kind, _ in blocks if group == "responses_api_agents"}
        servers = {kind for _, group, kind, _ in blocks if group == _GROUP}
        if len(servers) == 1 and agents and agents <= set(PLAYED_AGENTS):
            found[member.split("/")[1]] = member
    return found


@_per_wheel
def folder_servers() -> dict[str, str]:
    """Each ``environments/`` folder that is one resources server's config: name -> that config's ``--env`` name."""
    found: dict[str, str] = {}
    for member, config in _folder_configs():
        paths = config.get("config_paths") or []
        if len(paths) != 1 or not _is_server_config(str(paths[0])):
            continue
        parts = str(paths[0]).split("/")
        if all(group == _GROUP and kind == parts[1] for _, group, kind, _ in server_blocks(config)):
            found[member.split("/")[1]] = parts[3][: -len(".yaml")]
    return found


@_per_wheel
def config_names() -> dict[str, str]:
    """``CONFIG`` -> its member, for each config not named after its server (a stem two share names neither)."""
    found: dict[str, list[str]] = {}
    with gym_wheel.opened() as archive:
        for member in filter(_is_server_config, sorted(archive.namelist())):
            parts = member.split("/")
            stem = parts[3][: -len(".yaml")]
            if stem != parts[1]:
                found.setdefault(stem, []).append(member)
    return {stem: members[0] for stem, members in found.items() if len(members) == 1}


@_per_wheel
def benchmark_environments() -> dict[str, tuple[str, str]]:
    """Each ``simple_agent`` benchmark whose config changes its grader: its ``--env`` name -> (catalog name, config)."""
    found: dict[str, tuple[str, str]] = {}
    taken = {*shipped_environments(), *catalog_folders(), *config_names(), *_agent_configs_of()}
    with gym_wheel.opened() as archive:
        names = sorted(archive.namelist())
    for member in (m for m in names if m.startswith(f"{_BENCHMARKS}/") and m.endswith("/manifest.yaml")):
        with contextlib.suppress(yaml.YAMLError, UnicodeDecodeError):
            manifest = own_config(member)
            config = posixpath.normpath(
                posixpath.join(posixpath.dirname(member), str(manifest.get("config_path") or "config.yaml"))
            )
            if manifest.get("kind") == "benchmark" and manifest.get("agent_server") == "simple_agent":
                name = str(manifest.get("name"))
                key = name.replace("/", ".")
                if grader_settings(config):
                    found[f"{key}{BENCHMARK_SUFFIX}" if key in taken else key] = (name, config)
    return found


def _spelling_problem(said: str) -> str | None:
    """Why a catalog spelling ``resources_servers/NAME/CONFIG`` names no config of the wheel, or None."""
    parts = said.split("/")
    if len(parts) != 3 or parts[0] != _GROUP or short_name(said) == said:
        return None
    if config_names().get(parts[2]) == f"{_GROUP}/{parts[1]}/configs/{parts[2]}.yaml":
        return None
    return f"{said!r} is not a config nemo-gym ships (no {_GROUP}/{parts[1]}/configs/{parts[2]}.yaml)"


@_per_wheel
def refused_folders() -> dict[str, str]:
    """Each ``environments/`` folder whose agent this package refuses to run: name -> why."""
    found: dict[str, str] = {}
    for member, config in _folder_configs():
        name = member.split("/")[1]
        agents = {kind for _, group, kind, _ in server_blocks(config) if group == "responses_api_agents"}
        if not agents or agents <= set(PLAYED_AGENTS):
            continue
        reason = config_refusal(name, config, shipped_config(member))
        if reason:
            found[name] = reason
    return found


def config_refusal(name: str, config: Mapping[str, Any], composed: Mapping[str, Any] | None = None) -> str | None:
    """Why this package does not run a shipped config: a requirement beyond PyPI, else ``refusal`` of ``composed``."""
    for group, role in (("responses_api_agents", "agent"), (_GROUP, "resources server")):
        for kind in sorted({k for _, g, k, _ in server_blocks(config) if g == group}):
            try:
                _requirement_lines(name, group, kind)
            except GymEnvironmentError as error:
                return str(error).replace("its requirements.txt", f"its {role} {kind}'s requirements.txt")
    return refusal(name, config if composed is None else composed, None)


def example_rows_member(name: str) -> str:
    """Where the wheel keeps environment ``name``'s example rows (``UnknownEnvironmentError``: not shipped)."""
    _check_shipped([name])
    name = _served_name(name)
    if name in benchmark_environments():
        return _rows_of(benchmark_environments()[name][1])  # none in 0.7.0: convert --env BENCHMARK=FILE
    folders = catalog_folders()
    if name in folders and name not in shipped_environments():
        return _rows_of(folders[name])
    if name not in shipped_environments() and name in config_names():
        return _config_rows(config_names()[name])
    return _rows_of(f"{_GROUP}/{name}/")


def shipped_examples(env: str | None) -> tuple[str, str, Path]:
    """The example rows of ``env`` (None: SWE-bench Verified's) as JSONL, their member and the wheel.
    ``ValueError`` says why ``env`` has none; ``OSError``/``RuntimeError``: the wheel is unreadable."""
    if env is None:
        text = "".join(json.dumps(row) + "\n" for row in gym_wheel.example_rows())
        return text, gym_wheel.EXAMPLES_MEMBER, gym_wheel.wheel_path()
    name = short_name(env)
    problem = environment_name_problem(name)
    if problem:
        raise ValueError(f"--env {name!r}: {problem}")
    try:
        member = example_rows_member(name)
    except UnknownEnvironmentError as error:
        raise ValueError(str(error)) from None
    if not gym_wheel.ships(member):
        raise ValueError(
            f"--env {name!r}: nemo-gym ships no example rows for it (no {member} in the wheel); "
            "write its task rows yourself, or try one that has them, e.g. --env mcqa"
        )
    text = gym_wheel.read_member(member).decode("utf-8")
    return text + ("" if not text or text.endswith("\n") else "\n"), member, gym_wheel.wheel_path()


def _config_rows(config: str) -> str:
    """A config's ``example`` dataset's file, else its folder's ``data/example.jsonl``."""
    for _, group, _, block in server_blocks(shipped_config(config)):
        for dataset in block.get("datasets") or () if group == "responses_api_agents" else ():
            if isinstance(dataset, dict) and dataset.get("type") == "example" and dataset.get("jsonl_fpath"):
                return str(dataset["jsonl_fpath"])
    return _rows_of(config)


@_per_wheel
def _server_configs() -> dict[str, tuple[str, ...]]:
    """Each resources server's configs in the wheel (``resources_servers/X/configs/*.yaml``)."""
    found: dict[str, list[str]] = {}
    with gym_wheel.opened() as archive:
        for member in filter(_is_server_config, archive.namelist()):
            found.setdefault(member.split("/")[1], []).append(member)
    return {server: tuple(sorted(members)) for server, members in found.items()}


def _config_member(name: str) -> str:
    folder = f"{_GROUP}/{name}/configs/"
    found = list(_server_configs().get(name, ()))
    named = f"{folder}{name}.yaml"
    if named in found:
        return named
    if len(found) == 1:
        return found[0]
    stems = config_names()
    instead = [f"{_GROUP}/{name}/{m.rsplit('/', 1)[1][:-5]}" for m in found if stems.get(m.rsplit("/", 1)[1][:-5]) == m]
    fix = (
        f"give one by its catalog name (or its last part): {', '.join(instead)}"
        if instead
        else "none has a name of its own"
    )
    raise GymEnvironmentError(
        f"environment {name!r}: nemo-gym ships {len(found)} configs in {folder} "
        f"({', '.join(m.rsplit('/', 1)[1] for m in found) or 'none'}) and none is named {name}.yaml, so "
        f"this package cannot tell which one to serve; {fix}"
    )


def _requirement_lines(name: str, group: str, kind: str) -> tuple[str, ...]:
    """``<group>/<kind>/requirements.txt``'s lines beyond nemo-gym; one needing more than PyPI is refused."""
    member = f"{group}/{kind}/requirements.txt"
    text = gym_wheel.read_member(member).decode("utf-8") if gym_wheel.ships(member) else ""
    lines: list[str] = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if re.match(r"(-e\s+)?nemo[-_]gym\b", line) or re.fullmatch(r"-e\s+\.\./\.\./?", line):
            continue  # nemo-gym itself (the wheel's own folder, two levels up)
        if "://" in line or " @ " in line or line.startswith("-") or not _PYPI_LINE.fullmatch(line):
            raise GymEnvironmentError(
                f"environment {name!r}: its requirements.txt line {line!r} needs more than PyPI (a URL, a git "
                "repository or a pip option); this package installs PyPI requirements only, so it cannot serve "
                f"{name!r}. Run it with NeMo-Gym's own tooling, where that network access is allowed."
            )
        lines.append(line)
    return tuple(lines)


def _agent(entry: Any) -> dict[str, Any] | None:
    """The ``simple_agent`` block of a config entry, if it is one."""
    agent = (entry.get("responses_api_agents") or {}).get("simple_agent") if isinstance(entry, dict) else None
    return agent if isinstance(agent, dict) else None


def _instance(name: str, folder: str, config: Mapping[str, Any], member: str) -> tuple[str, int | None]:
    """The instance serving ``name`` (docs/environments.md, "Serving environments") and its ``max_steps``."""
    named = _agent(config.get(f"{name}{AGENT_SUFFIX}"))
    served = (named or {}).get("resources_server") or {}
    if served.get("name") in config:
        instances = [str(served["name"])]
    else:
        instances = [
            key
            for key, entry in config.items()
            if isinstance(entry, dict) and isinstance(entry.get(_GROUP), dict) and folder in entry[_GROUP]
        ]
    if len(instances) > 1:
        played = {str(block.get("resources_server", {}).get("name")) for block in _agent_blocks(config)}
        instances = [i for i in instances if i in played] or instances
    if len(instances) != 1:
        raise GymEnvironmentError(_instances_refusal(name, folder, member, instances))
    playing = (
        a for e in config.values() if (a := _agent(e)) and (a.get("resources_server") or {}).get("name") == instances[0]
    )
    steps = next(playing, {}).get("max_steps")
    return instances[0], steps if isinstance(steps, int) else None


def _agent_blocks(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for _, group, _, block in server_blocks(config)
        if group == "responses_api_agents" and isinstance(block.get("resources_server"), dict)
    ]


def _instances_refusal(name: str, folder: str, member: str, instances: Sequence[str]) -> str:
    """Why a config holding no, or several unplayed, ``folder`` servers is not an environment."""
    if not instances:
        return f"environment {name!r}: {member} holds no {folder} resources server"
    players = []
    for stem, config in sorted(config_names().items()):
        if config.startswith(f"{_GROUP}/{folder}/configs/") and config != member:
            for block in _agent_blocks(shipped_config(config)):
                if block["resources_server"].get("name") in instances:
                    players.append(f"{stem} ({block['resources_server']['name']})")
    fix = (
        f"serve a config of {_GROUP}/{folder} that pairs one with its agent: {', '.join(players)}"
        if players
        else "no config of its folder pairs one with an agent"
    )
    return (
        f"environment {name!r}: {member} holds {len(instances)} {folder} resources servers "
        f"({', '.join(instances)}) and no agent playing one, so it is no environment: nemo-gym's own "
        f"catalog lists a config only when an agent in it has datasets; {fix}"
    )


def _driver(config: Mapping[str, Any], instance: str, routed: bool) -> str | None:
    """The agent instance whose ``/run`` plays ``instance``'s rows; None for a ``simple_agent`` unless ``routed``."""
    found = [
        (key, kind)
        for key, group, kind, block in server_blocks(config)
        if group == "responses_api_agents" and (block.get("resources_server") or {}).get("name") == instance
    ]
    simple = [key for key, kind in found if kind == "simple_agent"]
    if simple:
        return simple[0] if routed else None
    return found[0][0] if found else None


@_per_wheel
def _agent_configs_of() -> dict[str, str]:
    """``X`` -> the shipped config holding agent ``X_simple_agent`` (how rows name environments)."""
    found: dict[str, str] = {}
    with gym_wheel.opened() as archive:
        members = list(filter(_is_server_config, archive.namelist()))
    for member in members:
        with contextlib.suppress(yaml.YAMLError, UnicodeDecodeError):
            for key, entry in own_config(member).items():
                if str(key).endswith(AGENT_SUFFIX) and _agent(entry) is not None:
                    found.setdefault(str(key)[: -len(AGENT_SUFFIX)], member)
    return found


def _is_server_config(member: str) -> bool:
    return re.fullmatch(rf"{_GROUP}/[^/]*/configs/[^/]*\.yaml", member) is not None


def check_shipped(names: Sequence[str]) -> str | None:
    """None when nemo-gym ships all ``names``, else why not; ``GymEnvironmentError`` for one it refuses."""
    try:
        _check_shipped(names)
    except UnknownEnvironmentError as unknown:
        return str(unknown)
    return None


def _served_name(name: str) -> str:
    """``name`` as :func:`plan` keys it (short name, or a :func:`benchmark_environments` name: as served, or
    its catalog name)."""
    name = short_name(name)
    served = benchmark_environments()
    if name in served:
        return name
    dotted = name.replace("/", ".")
    return next((key for key, (catalog, _) in served.items() if catalog == name and key == dotted), name)


def _check_shipped(said: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """:func:`check_shipped`'s check: the names as :func:`plan` keys them, and the agents' configs it needs."""
    problems = [problem for n in said if (problem := _spelling_problem(n))]
    if problems:
        raise UnknownEnvironmentError("; ".join(problems))
    names = [_served_name(n) for n in said]
    shipped = sorted({*shipped_environments(), *catalog_folders(), *config_names(), *benchmark_environments()})
    agents = {} if set(names) <= set(shipped) else _agent_configs_of()
    unknown = [n for n in names if n not in shipped and n not in agents]
    refused = refused_folders() if unknown else {}
    if any(n in refused for n in unknown):
        raise GymEnvironmentError("; ".join(refused[n] for n in unknown if n in refused))
    folders = _server_configs()
    base = [n for n in unknown if n in folders]  # a folder with configs but no app.py
    if base:
        raise GymEnvironmentError("; ".join(f"environment {n!r}: {_no_server(n, folders[n])}" for n in base))
    if unknown:
        known = {*shipped, *agents}
        hints = (f"{name!r} is not an environment nemo-gym ships ({_close_hint(name, known)})" for name in unknown)
        raise UnknownEnvironmentError("; ".join(hints))
    return names, agents


def _no_server(name: str, configs: Sequence[str]) -> str:
    """Why a resources-server folder without ``app.py`` (``gymnasium``) is served by nothing."""
    block = ((own_config(configs[0]).get(name) or {}).get(_GROUP) or {}).get(name)
    said = block if isinstance(block, dict) else {}
    entry = said.get("entrypoint") or "no app.py"
    about = f" ({said['description']})" if said.get("description") else ""
    return f"its folder has no app.py, its entrypoint is {entry}{about}: not a server on its own"


def _close_hint(name: str, known: Collection[str]) -> str:
    """Up to three of ``known`` like ``name`` as a hint, case ignored, one differing in case only first."""
    close = difflib.get_close_matches(name.lower(), sorted({k.lower() for k in known}), n=3, cutoff=0.5)
    spelled = [k for lowered in close for k in sorted(known) if k.lower() == lowered][:3]
    return f"did you mean {', '.join(spelled)}?" if spelled else "no similar name"


def plan(names: Sequence[str], *, routed: bool = False) -> list[EnvironmentPlan]:
    """``names`` (duplicates dropped) as the wheel ships them (docs/environments.md, "Serving environments");
    ``routed``: a ``simple_agent`` one is played by its agent's ``/run`` too."""
    if not names:
        return []
    served, agents = _check_shipped(names)
    shipped = shipped_environments()
    folders = catalog_folders()
    stems = config_names()
    benchmarks = benchmark_environments()
    plans: list[EnvironmentPlan] = []
    for name in dict.fromkeys(served):
        if name in benchmarks:
            plans.append(_benchmark_plan(name, benchmarks[name][1], routed))
            continue
        config = _config_member(name) if name in shipped else folders.get(name) or stems.get(name) or agents[name]
        composed = own_config(config)
        folder = (
            config.split("/")[1]
            if config.startswith(f"{_GROUP}/")
            else next(kind for _, group, kind, _ in server_blocks(composed) if group == _GROUP)
        )
        if not any(group == _GROUP and kind == folder for _, group, kind, _ in server_blocks(composed)):
            composed = shipped_config(config)  # its resources server comes from a config it pulls in
        instance, steps = _instance(name, folder, composed, config)
        twin = next((p.name for p in plans if p.instance == instance), None)
        if twin is not None:
            raise GymEnvironmentError(
                f"environments {twin!r} and {name!r} are both served by instance {instance!r} of "
                f"resources_servers/{folder}; give one of them (another config needs a serve of its own)"
            )
        driver = _driver(composed, instance, routed)
        reward_range = _REWARD_RANGES.get(name) if driver else None
        needs = _requirement_lines(name, _GROUP, folder)
        plans.append(EnvironmentPlan(name, config, instance, needs, steps, driver, reward_range))
    _check_inherited(plans)
    return plans


def _benchmark_plan(name: str, config: str, routed: bool) -> EnvironmentPlan:
    """Benchmark ``name`` served from its own config: the resources server its ``simple_agent`` plays."""
    composed = inherited_config(config)
    played = [
        (str(block["resources_server"].get("name")), block)
        for _, group, kind, block in server_blocks(composed)
        if group == "responses_api_agents"
        and kind == "simple_agent"
        and isinstance(block.get("resources_server"), dict)
        and any(isinstance(d, dict) and d.get("type") == "benchmark" for d in block.get("datasets") or ())
    ]
    servers = [
        (i, kind) for i, group, kind, _ in server_blocks(composed) if group == _GROUP and i in [p[0] for p in played]
    ]
    if len(played) != 1 or len(servers) != 1:
        raise GymEnvironmentError(f"benchmark {name!r}: {config} has no one resources server its simple_agent plays")
    instance, folder = servers[0]
    steps = played[0][1].get("max_steps")
    needs = _requirement_lines(name, _GROUP, folder)
    return EnvironmentPlan(
        name, config, instance, needs, steps if isinstance(steps, int) else None, _driver(composed, instance, routed)
    )


def _check_inherited(plans: Sequence[EnvironmentPlan]) -> None:
    """A benchmark's ``_inherit_from`` moves the instance it inherits: that one is not served beside it."""
    for p in plans:
        for instance, entry in own_config(p.config).items() if p.config.startswith(f"{_BENCHMARKS}/") else ():
            source = entry.get("_inherit_from") if isinstance(entry, dict) else None
            other = next((o.name for o in plans if o.instance == source), None)
            if other is not None:
                raise GymEnvironmentError(
                    f"environments {other!r} and {p.name!r}: {p.name}'s config makes {instance!r} of {other}'s "
                    f"{source!r} (nemo-gym's _inherit_from moves it), so they cannot share one composed config; "
                    "serve them with one serve each"
                )


def plan_config(p: EnvironmentPlan) -> dict[str, Any]:
    """The config ``serve`` reads for plan ``p`` before nemo-gym composes it."""
    return inherited_config(p.config) if p.config.startswith(f"{_BENCHMARKS}/") else shipped_config(p.config)


def setting(plans: Sequence[EnvironmentPlan], urls: Mapping[str, str], agents: Mapping[str, str]) -> str:
    """The ``NEMO_GYM_ENVS`` value: each URL, with ``max_steps``, or its agent's URL and reward range."""
    value: dict[str, Any] = {}
    for p in plans:
        if p.agent:
            reward = {"reward_range": list(p.reward_range)} if p.reward_range else {}
            value[p.name] = {"url": urls[p.name], "agent": agents[p.name], **reward}
        else:
            value[p.name] = {"url": urls[p.name], "max_steps": p.max_steps} if p.max_steps else urls[p.name]
    return json.dumps(value)


def refusals(plans: Sequence[EnvironmentPlan], judge: Judge | None) -> list[str]:
    """Why ``serve`` cannot serve each refused plan (one line each), read from the wheel."""
    found = (refusal(p.name, plan_config(p), judge) for p in plans)
    return [reason for reason in found if reason]


def environment_needs(plans: Sequence[EnvironmentPlan], judge: Judge | None) -> list[str]:
    """What the servers of ``plans`` need that this host lacks (``serve --dry-run``)."""
    return [f"{p.name}: {need}" for p in plans for need in config_needs(served(plan_config(p), judge), os.environ)]


def _payload(
    site_packages: Path,
    plans: Sequence[EnvironmentPlan],
    judge: Judge | None,
    policy_base_url: str = PLACEHOLDER_POLICY_URL,
    extra_configs: Sequence[Path] = (),
    *,
    routed: bool = False,
) -> dict[str, Any]:
    """What nemo-gym's parser is given for ``plans``: their configs, the policy model's, and ``serve``'s layer."""
    return {
        **layer([plan_config(p) for p in plans], judge),
        "config_paths": [str(site_packages / p.config) for p in plans]
        + [str(_ROUTING_CONFIG if routed else site_packages / MODEL_CONFIG)]
        + [str(path) for path in extra_configs],
        "policy_base_url": policy_base_url,
        "policy_api_key": "unused",
        "policy_model_name": "policy",
        **(_ROLLOUT_ID_SETTING if routed else {}),
    }


def missing_requirements(gym: GymVenv, plans: Sequence[EnvironmentPlan]) -> list[str]:
    """The requirement lines of ``plans`` the server venv does not satisfy (sorted, unique)."""
    return _unsatisfied(gym, sorted({line for p in plans for line in p.requirements}))


def _unsatisfied(venv: GymVenv, lines: list[str]) -> list[str]:
    if not lines:
        return []
    done = run_in_gym(venv, _SATISFIED, [json.dumps(lines)])
    if done.returncode != 0:
        raise GymEnvironmentError(f"could not read the requirements {lines}: {done.stderr.strip()[-2000:]}")
    satisfied = json.loads(done.stdout.strip().splitlines()[-1])
    return [line for line, ok in zip(lines, satisfied, strict=True) if not ok]


def overlay_path(gym: GymVenv, requirements: Sequence[str]) -> Path:
    """Where the overlay venv for ``requirements`` on top of ``gym`` is cached."""
    digest = hashlib.sha256("\n".join(sorted(set(requirements))).encode()).hexdigest()[:12]
    return gym_venv_root() / f"{gym.path.name}.envs-{digest}"


def ready_python(link: Path) -> Path | None:
    """The interpreter of the overlay venv at ``link`` if it is built (never builds)."""
    python = link / "bin" / "python"
    return python if (link / _READY).is_file() and python.exists() else None


def _build_overlay(gym: GymVenv, requirements: Sequence[str], target: Path, log: Path, progress: Progress) -> None:
    python = target / "bin" / "python"
    # No pip of its own: the server venv's, seen through the .pth, installs into this one.
    run_build_step(
        [str(gym.python), "-m", "venv", "--without-pip", str(target)], progress, "python -m venv", log_path=log
    )
    where = run_in_gym(GymVenv(target, python, target), "import sysconfig; print(sysconfig.get_path('purelib'))")
    where.check_returncode()
    # The server venv stays where it is: the overlay sees its packages after its own.
    site_packages = Path(where.stdout.strip())
    (site_packages / "miles_nemogym_gym.pth").write_text(f"import site; site.addsitedir({str(gym.site_packages)!r})\n")
    progress(f"installing {', '.join(requirements)}")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *requirements]
    run_build_step(pip, progress, "pip install of the environments' requirements", log_path=log)
    left = _unsatisfied(GymVenv(target, python, site_packages), list(requirements))
    if left:
        raise GymEnvironmentError(f"after installing, the overlay venv still lacks {left}; pip's log: {log}")
    marker = {"gym": gym.path.name, "requirements": list(requirements)}
    (target / _READY).write_text(json.dumps(marker, indent=2))


def environment_python(gym: GymVenv, plans: Sequence[EnvironmentPlan], progress: Progress) -> Path:
    """The server venv's interpreter, else the overlay venv's for the missing requirements (built once)."""
    requirements = missing_requirements(gym, plans)
    if not requirements:
        return gym.python
    link = overlay_path(gym, requirements)
    ready = ready_python(link)
    if ready:
        progress(f"using the cached environments' requirements {link}")
        return ready
    log = link.parent / f"{link.name}.build.log"

    def build(target: Path) -> None:
        log.unlink(missing_ok=True)
        progress(f"installing the environments' requirements into {link} (once; pip's log: {log})")
        _build_overlay(gym, requirements, target, log, progress)

    return build_once(link, ready_python, build, progress, f"overlay venv for {requirements}")


class EnvironmentServers:
    """The resources servers of ``plans`` (and ``start(also=...)``'s instances) as child processes."""

    def __init__(
        self,
        gym: GymVenv,
        plans: Sequence[EnvironmentPlan],
        *,
        state_dir: Path,
        host: str = "127.0.0.1",
        first_port: int = 0,
        policy_base_url: str = PLACEHOLDER_POLICY_URL,
        progress: Progress | None = None,
        start_timeout: float = 180.0,
        extra_env: Mapping[str, str] | None = None,
        extra_configs: Sequence[Path] = (),
        app_folders: Mapping[str, Path] | None = None,
        judge: Judge | None = None,
        session_servers: Sequence[str] = (),
        rollout_secret: str | None = None,
    ) -> None:
        self.gym = gym
        self.plans = list(plans)
        self.state_dir = state_dir
        self.host = host
        self.first_port = first_port
        self.policy_base_url = policy_base_url
        self.start_timeout = start_timeout
        self._progress = progress or BuildLines("gym-envs")
        self._extra_env = dict(extra_env or {})
        self._extra_configs = list(extra_configs)
        """More config files for the parser (servers that are not in the wheel: a benchmark's stand-in)."""
        self._app_folders = dict(app_folders or {})
        """Instance -> the folder of its ``app.py``, for instances not under site-packages."""
        self.judge = judge
        self.routed = any(p.agent for p in self.plans)
        """Agents are served: ``policy_model`` is the routing model, allowed ``session_servers``."""
        self.session_servers = list(session_servers)
        self.rollout_secret = (rollout_secret or os.environ.get(SECRET_VARIABLE) or secrets.token_urlsafe(32)).strip()
        """What the routing model checks rollout ids against (given, else ``NEMO_GYM_ROLLOUT_SECRET``, else new)."""
        if self.routed:
            self._app_folders.setdefault(POLICY_MODEL, ROUTING_MODEL)
            self._extra_env["NEMO_GYM_EXTRA_ROOTS"] = str(ROUTING_ROOT)
        self._marker = uuid.uuid4().hex
        self._logs: list[ServerLog] = []
        self._gate: JudgeGate | None = None
        """The relay the judge's model server calls (serve's process alone holds the judge's key)."""
        self.config: dict[str, Any] = {}
        """The composed config (after ``start``)."""
        self.ports: dict[str, int] = {}
        """Instance name -> port of every started process."""
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._tmp: Path | None = None
        self._cli_bins: dict[str, Path] = {}
        """Harness agent instance -> the folder of its CLI (``gym/_harness.py``), put first on its PATH."""

    def _url(self, instance: str, advertised: bool) -> str:
        port = self.ports[instance]
        return advertised_url(self.host, port) if advertised else f"http://{connect_host(self.host)}:{port}"

    def urls(self, advertised: bool = False) -> dict[str, str]:
        """Environment name -> its resources server's base URL (``advertised``: for other machines)."""
        return {p.name: self._url(p.instance, advertised) for p in self.plans}

    def agent_urls(self, advertised: bool = False) -> dict[str, str]:
        """Environment name -> the base URL of the agent server playing it (those that have one)."""
        return {p.name: self._url(p.agent, advertised) for p in self.plans if p.agent}

    def setting(self, advertised: bool = True) -> str:
        """The ``NEMO_GYM_ENVS`` value for trainers on other machines (else on this one)."""
        return setting(self.plans, self.urls(advertised), self.agent_urls(advertised))

    def log_path(self, instance: str) -> Path:
        return self.state_dir / f"{instance}.log"

    def log_tail(self, instance: str) -> str:
        """Its log's path, then the log's last lines."""
        return log_tail(self.log_path(instance))

    def exited(self) -> list[str]:
        """Started instances whose process has exited."""
        return [name for name, process in self._processes.items() if process.poll() is not None]

    def compose(self) -> dict[str, Any]:
        """The config every server gets, composed by nemo-gym's parser (once; ``start`` reuses it)."""
        if self.config:
            return self.config
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.judge is not None and self._gate is None:
            relay_log = self.state_dir / f"{JUDGE_INSTANCE}.relay.log"
            self._gate = JudgeGate(self.judge, os.environ.get(JUDGE_KEY_ENV), run_secrets(self.judge.url), relay_log)
        payload = _payload(
            self.gym.site_packages,
            self.plans,
            self._gate.judge if self._gate is not None else None,
            self.policy_base_url,
            self._extra_configs,
            routed=self.routed,
        )
        composed = load_yaml(parse_config(self.gym, payload, self.state_dir, "environments' config", self._extra_env))
        if not isinstance(composed, dict):
            raise GymEnvironmentError(f"nemo-gym's parser returned no config for {[p.name for p in self.plans]}")
        if self.routed:
            composed[POLICY_MODEL]["responses_api_models"]["miles_routing_model"]["session_servers"] = list(
                self.session_servers
            )
        self.config = composed
        return composed

    def _where(self, instance: str) -> tuple[str, str]:
        """(group, kind) of a composed instance: its app is ``<site-packages>/<group>/<kind>/app.py``."""
        entry = self.config.get(instance)
        if not isinstance(entry, dict) or len(entry) != 1:
            raise GymEnvironmentError(f"the composed config has no server instance {instance!r}")
        group, kinds = next(iter(entry.items()))
        if not isinstance(kinds, dict) or len(kinds) != 1:
            raise GymEnvironmentError(f"the composed config's {instance!r} is not one server")
        return str(group), str(next(iter(kinds)))

    def start(self, also: Sequence[str] = (), *, again: bool = True) -> EnvironmentServers:
        """Install, compose, start every server and wait until each answers; ``again``: retry a lost free port."""
        python = environment_python(self.gym, self.plans, self._progress)
        self.compose()
        if self._gate is not None:
            self._gate.start()
        names = [p.instance for p in self.plans]
        served = [p.agent for p in self.plans if p.agent]
        also = list(dict.fromkeys([*also, *served, *([POLICY_MODEL] if self.routed else [])]))
        judge = [JUDGE_INSTANCE] if JUDGE_INSTANCE in self.config and JUDGE_INSTANCE not in also else []
        given = {self.first_port + index for index in range(len(names))} if self.first_port else set()
        self.ports = {}
        picked: set[str] = set()
        for index, name in enumerate([*names, *also, *judge]):
            group, kind = self._where(name)
            block = self.config[name][group][kind]
            if kind in HARNESSES:
                self._cli_bins[name] = cli_bin(kind, block, self._progress)
            if self.first_port and name in names:
                port = self.first_port + index
                if not port_free(self.host, port):
                    raise GymEnvironmentError(
                        f"port {port} on {self.host} (for environment {self.plans[index].name!r}) is taken; "
                        "give another --port, or --port 0 for free ports"
                    )
            else:
                port = free_port(self.host, avoid={*given, *self.ports.values()})
                picked.add(name)
            block["host"], block["port"] = self.host, port
            self.ports[name] = port
        text = yaml.safe_dump(self.config)
        self._progress(f"starting {counted(len(self.ports), 'server')}: {', '.join(self.ports)}")
        try:
            for name in self.ports:
                group, kind = self._where(name)
                folder = self._app_folders.get(name) or self.gym.site_packages / group / kind
                self._spawn(python, name, folder, text)
            # Start-up is import-bound: waiting on each in turn takes as long as the slowest.
            deadline = time.monotonic() + self.start_timeout
            for name in self.ports:
                self._wait(name, deadline)
        except BaseException as error:
            self.stop()
            # uvicorn's "[Errno 98] ... address already in use": another program bound the free port first
            if not isinstance(error, GymEnvironmentError) or not again:
                raise
            if any("address already in use" in self.log_tail(name).lower() for name in picked):
                self._progress("a free port was taken before its server bound it: starting again on fresh ports")
                return self.start(also, again=False)
            raise
        return self

    def _spawn(self, python: Path, name: str, folder: Path, config_yaml: str) -> None:
        # Unix socket paths stay below ~107 bytes and a server's own Ray (code_gen) puts sockets ~70 bytes
        # below RAY_TMPDIR, so a deep --state-dir would break it: a short folder of the run's, removed on stop.
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="mng-envs-", dir="/tmp" if os.path.isdir("/tmp") else None))
        tmp = self._tmp
        env = {
            **child_environment(),
            "NEMO_GYM_CONFIG_DICT": config_yaml,
            "NEMO_GYM_CONFIG_PATH": name,
            "PYTHONPATH": str(folder),
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(tmp),
            "RAY_TMPDIR": str(tmp),
            "RAY_AUTH_MODE": "disabled",  # a server's private Ray writes no token into ~/.ray
            "PIP_NO_INDEX": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            MARKER_ENV: self._marker,
            **self._extra_env,
        }
        if name in self._cli_bins:
            # The harness' CLI, and its own config and cache folders this run's (not the user's home).
            env["PATH"] = os.pathsep.join([str(self._cli_bins[name]), env.get("PATH", os.defpath)])
            for variable in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
                env[variable] = str(tmp / name / variable.split("_")[1].lower())
        if self.routed and name == POLICY_MODEL:
            # The routing model's alone (every other process goes without them).
            if os.environ.get(POLICY_KEY_ENV):
                env[POLICY_KEY_ENV] = os.environ[POLICY_KEY_ENV]
            env[SECRET_VARIABLE] = self.rollout_secret
        hidden = [*run_secrets(self.judge.url if self.judge else None), self.rollout_secret]
        log = ServerLog(self.log_path(name), hidden)
        self._logs.append(log)
        # In its own folder, as nemo-gym's launcher runs it: servers open files relative to it
        # (equivalence_llm_judge's prompt_templates/...).
        self._processes[name] = spawn([str(python), str(folder / "app.py")], folder, env, log)

    def _wait(self, name: str, deadline: float) -> None:
        port = self.ports[name]
        failed = wait_until_answering(self._processes[name], self.host, port, self._marker, deadline, 0.3)
        if failed is None:
            return
        why = {
            "another": f"another program answers on port {port}, not the {name} server serve started; stop that "
            "program or give another --port",
            "exited": f"{name} exited during start",
        }.get(failed, f"{name} did not answer within {self.start_timeout:.0f} s")
        raise GymEnvironmentError(f"{why}; log {self.log_tail(name)}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM each server's process group, SIGKILL what is left; idempotent."""
        if self._processes:
            terminate(self._processes.values(), self._marker, timeout)
        self._processes.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self._gate is not None:
            self._gate.stop()
            self._gate = None
            self.config = {}  # it named the relay's port: a later start composes with a new relay
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
