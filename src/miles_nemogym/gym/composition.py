"""What ``serve`` changes in a shipped environment's config before nemo-gym's parser composes it, and which
environments it refuses, read from the wheel (why: docs/environments.md, "Serving environments")."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache, reduce
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from miles_nemogym.errors import redact_url
from miles_nemogym.gym import wheel as gym_wheel
from miles_nemogym.gym._harness import HARNESSES, NOT_RUN_HERE, cli_need
from miles_nemogym.yaml_file import load as load_yaml

__all__ = ["Judge"]

JUDGE_INSTANCE = "miles_nemogym_judge"
"""The composed config's instance of the judge model server ``serve`` starts."""
JUDGE_KEY_ENV = "NEMO_GYM_JUDGE_API_KEY"
"""The judge endpoint's API key: read only from this variable, held by ``serve``'s judge relay alone."""
POLICY_KEY_ENV = "NEMO_GYM_POLICY_API_KEY"
POLICY_MODEL = "policy_model"
"""The instance every agent calls its model through (the routing model, when agents are served)."""

_GROUPS = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
_JUDGE_FIELD = "judge_model_server"
_INHERIT = "_inherit_from"
# A resources server's switch that leaves its judge unused (nemo-gym 0.7.0's configs).
_JUDGE_SWITCHES = ("should_use_judge", "enable_llm_judge", "use_judge")
# Agents whose model calls lose the rollout id in nemo-gym 0.7.0 (their app.py in the wheel).
_ID_DROPPED = {
    "harbor_agent": "builds its model URL as a bare host:port/v1 (_resolve_model_base_url), "
    "without the /ng-rollout/<id> prefix",
    "langgraph_agent": "posts /v1/responses to its model server without url_path_for_run, "
    "so the /ng-rollout/<id> prefix is never added",
    "finance_agent": "posts /v1/responses to its model server without url_path_for_run, "
    "so the /ng-rollout/<id> prefix is never added",
    "labbench2_vlm_agent": "re-reads the row (model_dump, then model_validate) before simple_agent's run, and "
    "_ng_rollout_id is an excluded field, so the /ng-rollout/<id> prefix is never added",
}
# Resources servers whose app reads a file nemo-gym 0.7.0's wheel does not ship (their app.py).
_WHEEL_FOLDERS = ("resources_servers/", "benchmarks/", "responses_api_agents/")
_NOT_SHIPPED = {
    "wordle": "resources_servers/wordle/data/guesses.txt (its generate_data.py downloads the word list)",
}
_ENV_REFERENCE = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(,[^}]*)?\}")
# An API key a server's config reads with a null default: unset, the server has no key (its own
# validation refuses to start, or every call it makes is refused), so it is a need, not an option.
_NULL_KEY = re.compile(r"\w*api_key: '?\$\{oc\.(env|select):([A-Za-z_][A-Za-z0-9_]*),null\}")
_KEY_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""``yaml.safe_dump`` through libyaml when PyYAML has it: ``environments`` reads ~1,100 blocks."""


class Judge(BaseModel):
    """The OpenAI-compatible endpoint that grades (``serve --judge-url/--judge-model``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="base URL of an OpenAI-compatible server, e.g. http://judge:8000/v1")
    model: str = Field(min_length=1, description="the model name the judge server serves")

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not re.match(r"https?://[^/\s]+", value):
            raise ValueError(
                f"{redact_url(value)!r} is not an http(s) URL; give the judge's base URL, e.g. http://judge:8000/v1"
            )
        return value

    def server(self) -> dict[str, Any]:
        """The judge's model server block: nemo-gym's ``vllm_model`` (chat completions upstream)."""
        return {
            "responses_api_models": {
                "vllm_model": {
                    "entrypoint": "app.py",
                    "base_url": self.url,
                    "api_key": f"${{oc.env:{JUDGE_KEY_ENV},EMPTY}}",
                    "model": self.model,
                    "return_token_id_information": False,
                    "uses_reasoning_parser": True,
                }
            }
        }


def deep_merged(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` deep-merged into ``base`` (mappings merge, everything else replaces)."""
    result = dict(base)
    for key, value in over.items():
        old = result.get(key)
        result[key] = deep_merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return result


@lru_cache(maxsize=512)
def _member(member: str) -> dict[str, Any]:
    with gym_wheel.opened() as archive:
        try:
            loaded = load_yaml(archive.read(member))
        except KeyError:
            return {}
    return loaded if isinstance(loaded, dict) else {}


def own_config(member: str) -> dict[str, Any]:
    """A config of the wheel as written, without the configs it names in ``config_paths``."""
    return dict(_member(member))


def shipped_config(member: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A config of the wheel with the configs it names in ``config_paths`` (but not those in ``seen``) merged
    under it (as nemo-gym merges them: a config after what it pulls in), before nemo-gym's parser."""
    own = dict(_member(member))
    children = [c for c in own.pop("config_paths", None) or [] if isinstance(c, str) and c not in seen and c != member]
    return reduce(deep_merged, [*(shipped_config(child, (*seen, member)) for child in children), own], {})


def inherited_config(member: str) -> dict[str, Any]:
    """:func:`shipped_config` with each ``_inherit_from: SOURCE`` applied (SOURCE's block under the
    instance's own keys, SOURCE gone), as nemo-gym's parser applies it."""
    frozen = shipped_config(member)
    result = dict(frozen)
    for instance, entry in frozen.items():
        source = entry.get(_INHERIT) if isinstance(entry, dict) else None
        if isinstance(source, str) and isinstance(frozen.get(source), dict):
            own = {key: value for key, value in entry.items() if key != _INHERIT}
            result[instance] = deep_merged(frozen[source], own)
            result.pop(source, None)
    return result


def grader_settings(member: str) -> list[str]:
    """The settings a config's resources servers set in the config itself (``grading_mode``, ...)."""
    blocks = server_blocks(own_config(member))
    return sorted({key for _, group, _, block in blocks if group == "resources_servers" for key in block} - {_INHERIT})


def server_blocks(config: Mapping[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """``(instance, group, kind, block)`` of every server in a config."""
    for instance, entry in config.items():
        if not isinstance(entry, dict):
            continue
        for group in _GROUPS:
            kinds = entry.get(group)
            for kind, block in kinds.items() if isinstance(kinds, dict) else ():
                if isinstance(block, dict):
                    yield str(instance), group, str(kind), block


def _ref(value: Any) -> str | None:
    if isinstance(value, dict) and value.get("type") == "responses_api_models" and isinstance(value.get("name"), str):
        return str(value["name"])
    return None


def judged_instances(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(instance, kind, judge name)`` of each resources server whose ``judge_model_server`` is not switched off."""
    found = []
    for instance, group, kind, block in server_blocks(config):
        name = _ref(block.get(_JUDGE_FIELD))
        if group == "resources_servers" and name and not any(block.get(s) is False for s in _JUDGE_SWITCHES):
            found.append((instance, kind, name))
    return found


def overrides(config: Mapping[str, Any], judge: Judge | None) -> dict[str, Any]:
    """The layer ``serve`` merges over ``config`` (nemo-gym's parser merges it last)."""
    result: dict[str, Any] = {}
    redirected = set()
    for instance, group, kind, block in server_blocks(config):
        if "datasets" in block:
            result = deep_merged(result, {instance: {group: {kind: {"datasets": None}}}})
        if group == "responses_api_agents" and kind in HARNESSES:
            result = deep_merged(result, {instance: {group: {kind: dict(HARNESSES[kind].layer)}}})
        name = _ref(block.get(_JUDGE_FIELD))
        if judge is not None and group == "resources_servers" and name:
            result = deep_merged(result, {instance: {group: {kind: {_JUDGE_FIELD: {"name": JUDGE_INSTANCE}}}}})
            redirected.add(name)
    if judge is None or not redirected:
        return result
    still_named = {
        _ref(value)
        for _, group, _, block in server_blocks(config)
        for field, value in block.items()
        if not (group == "resources_servers" and field == _JUDGE_FIELD)
    }
    # A judge server the config defines and nothing else names is dropped: it would need its own
    # endpoint settings (e.g. ${judge_base_url}) to compose at all.
    for name in redirected - still_named - {POLICY_MODEL}:
        if name in config:
            result[name] = None
    result[JUDGE_INSTANCE] = judge.server()
    return result


def layer(configs: Sequence[Mapping[str, Any]], judge: Judge | None) -> dict[str, Any]:
    """The :func:`overrides` of several configs composed together, as one layer."""
    return reduce(deep_merged, (overrides(config, judge) for config in configs), {})


def served(config: Mapping[str, Any], judge: Judge | None) -> dict[str, Any]:
    """``config`` with :func:`overrides` merged in, as the parser is given it (null entries gone)."""
    composed = deep_merged(dict(config), overrides(config, judge))
    return {key: value for key, value in composed.items() if value is not None}


def _policy_use(name: str, instance: str, kind: str, block: Mapping[str, Any]) -> str | None:
    """Why a resources server that calls ``policy_model`` or reads ``${policy_base_url}`` itself is refused."""
    for field, value in block.items():
        if field != _JUDGE_FIELD and _ref(value) == POLICY_MODEL:
            return (
                f"environment {name!r}: its resources server {instance!r} ({kind}) calls {POLICY_MODEL} itself "
                f"({field}), without a rollout id, so serve has no sample's session to send those calls to"
            )
        if isinstance(value, str) and "${policy_base_url}" in value:
            return (
                f"environment {name!r}: its resources server {instance!r} ({kind}) reads the policy's own server "
                f"({field}: ${{policy_base_url}}); under serve the policy is each sample's Miles session, "
                "with no such server"
            )
    return None


def _unshipped_file(block: Mapping[str, Any]) -> str | None:
    """A ``*_fpath`` a resources server's settings point into the wheel that the wheel lacks, or None."""
    for key, value in block.items():
        named = str(key).endswith("_fpath") and isinstance(value, str) and value.startswith(_WHEEL_FOLDERS)
        if named and not gym_wheel.ships(value):
            return f"{value} (its {key})"
    return None


def refusal(name: str, config: Mapping[str, Any], judge: Judge | None) -> str | None:
    """Why ``serve`` cannot serve environment ``name`` as shipped, or None."""
    driver = config.get("rollout_collection_driver")
    if isinstance(driver, str) and driver:
        return (
            f"environment {name!r}: its config collects rollouts with its own driver "
            f"(rollout_collection_driver: {driver}), not one agent's /run per row; this package refuses it"
        )
    for instance, group, kind, block in server_blocks(config):
        missing = (_NOT_SHIPPED.get(kind) or _unshipped_file(block)) if group == "resources_servers" else None
        if missing:
            return (
                f"environment {name!r}: its resources server {instance!r} ({kind}) reads {missing}, "
                "which the nemo-gym 0.7.0 wheel does not ship; this package downloads no data, so it refuses it"
            )
        if group == "resources_servers" and (found := _policy_use(name, instance, kind, block)):
            return found
        if group != "responses_api_agents":
            continue
        if kind in NOT_RUN_HERE:
            return f"environment {name!r}: its agent {kind}: {NOT_RUN_HERE[kind]}"
        if kind in _ID_DROPPED:
            return (
                f"environment {name!r}: its agent {instance!r} ({kind}) {_ID_DROPPED[kind]} in nemo-gym 0.7.0, "
                "so its calls cannot be routed to the episode's session; this package refuses it"
            )
        model = _ref(block.get("model_server"))
        if model is not None and model != POLICY_MODEL:
            return (
                f"environment {name!r}: its agent {instance!r} ({kind}) calls model server {model!r}, not "
                f"{POLICY_MODEL}, so serve has no policy to route its calls to"
            )
    judged = judged_instances(config)
    if judged and judge is None:
        servers = ", ".join(sorted({f"{instance} (judge {model})" for instance, _, model in judged}))
        return (
            f"environment {name!r} grades with a judge model ({servers}); give its endpoint with "
            f"--judge-url URL --judge-model NAME (the key, if any, in {JUDGE_KEY_ENV})"
        )
    return None


def config_needs(
    config: Mapping[str, Any],
    environ: Mapping[str, str],
    which: Callable[[str], str | None] = shutil.which,
    *,
    cache: bool = True,
) -> list[str]:
    """What a config's servers need that this host lacks: variables, settings, sandboxes, agents' CLIs."""
    needs: list[str] = []
    for instance, group, kind, block in server_blocks(config):
        text = yaml.dump(block, Dumper=_DUMPER)
        for variable, default in _ENV_REFERENCE.findall(text):
            if not default and not environ.get(variable):
                needs.append(f"{instance} ({kind}): the environment variable {variable}")
        for key in _KEY_REFERENCE.findall(text):
            if key not in config and key not in _SET_BY_SERVE:
                needs.append(f"{instance} ({kind}): the setting {key} (an API key, URL or option)")
        for source, key in _NULL_KEY.findall(text):
            if source == "env" and not environ.get(key):
                needs.append(f"{instance} ({kind}): the environment variable {key} (an API key)")
            elif source == "select" and key not in config:
                needs.append(f"{instance} ({kind}): the setting {key} (an API key)")
        sandbox = _sandbox_need(block, environ)
        if sandbox:
            needs.append(f"{instance} ({kind}): {sandbox}")
        installed = cli_need(kind, block, which, cache=cache) if group == "responses_api_agents" else None
        if installed:
            needs.append(f"{instance} ({kind}): {installed}")
        command = str(block.get("command") or _AGENT_CLIS.get(kind, "")) if group == "responses_api_agents" else ""
        if command and kind not in HARNESSES and which(command) is None:
            needs.append(
                f"{instance} ({kind}): the {command!r} command on PATH (the agent's setup installs it with npm, "
                "which needs npm and the network)"
            )
    return list(dict.fromkeys(needs))


def _sandbox_need(block: Mapping[str, Any], environ: Mapping[str, str]) -> str | None:
    """What a server's task containers need here, or None (docs/environments.md, "Benchmarks of other agents")."""
    found = list(_sandbox_settings(block))
    if not found:
        return None
    providers = [value for key, value in found if key == "sandbox_provider"]
    if not providers or not all(isinstance(p, dict) for p in providers):
        return "a sandbox provider (task containers), which serve does not configure for --env servers"
    variables = list(dict.fromkeys(v for v, _ in _ENV_REFERENCE.findall(yaml.dump(providers, Dumper=_DUMPER))))
    unset = [v for v in variables if v not in environ]
    if variables and not unset:
        return None
    kinds = ", ".join(sorted({str(k) for p in providers for k in p}))
    where = f"set {', '.join(unset)} to yours" if unset else "at the address its config names"
    return f"the sandbox service its config connects to ({kinds}): {where}"


def _sandbox_settings(value: Any) -> Iterator[tuple[str, Any]]:
    """Each ``sandbox_provider`` or ``sandbox_config`` setting at any depth, with its value."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in ("sandbox_provider", "sandbox_config"):
                yield key, inner
            else:
                yield from _sandbox_settings(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _sandbox_settings(inner)


# The CLI each harness agent runs (nemo-gym 0.7.0: ``shutil.which`` in its ``setup_<name>.py``).
_AGENT_CLIS = {"claude_code_agent": "claude", "codex_agent": "codex"}
_SET_BY_SERVE: Sequence[str] = ("policy_base_url", "policy_api_key", "policy_model_name")
