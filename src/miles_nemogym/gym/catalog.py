"""NeMo-Gym's catalog: every environment and benchmark ``gym list environments`` names
(why a cache and not a scan of the wheel: docs/environments.md, "NeMo-Gym's catalog")."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from miles_nemogym.data import write_file
from miles_nemogym.gym import wheel as gym_wheel
from miles_nemogym.gym.composition import (
    Judge,
    config_needs,
    grader_settings,
    refusal,
    served,
    server_blocks,
    shipped_config,
)
from miles_nemogym.gym.environments import (
    benchmark_environments,
    catalog_folders,
    config_refusal,
    folder_servers,
    plan,
    plan_config,
    refused_folders,
)
from miles_nemogym.gym.venv import (
    GymEnvironmentError,
    GymVenv,
    Progress,
    cached_gym_venv,
    ensure_gym_venv,
    gym_venv_root,
    run_in_gym,
)
from miles_nemogym.settings import short_name

__all__ = ["Listed", "UnknownCatalogNameError", "listing"]

_RESOURCES = "resources_servers/"

# Runs in the server venv: nemo-gym's registry, manifests and config reader, printed as JSON.
_READER = """
import json, sys
from pathlib import Path
import nemo_gym
from nemo_gym.registry import discover_environment_catalog, read_environment_details
from nemo_gym.environment.manifest import load_manifest

root = Path(nemo_gym.__file__).resolve().parent.parent

def relative(path):
    if path is None:
        return None
    path = Path(path).resolve()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)

out = []
for entry in discover_environment_catalog():
    details = read_environment_details(entry.config_path)
    item = {
        "name": entry.name, "kind": entry.kind, "status": entry.status, "domain": entry.domain,
        "description": entry.description, "integration_profile": entry.integration_profile,
        "config": relative(entry.config_path), "agent": details["agent"],
        "resources_servers": details["resources_servers"],
        "datasets": [{"name": name} for name in details["datasets"]],
    }
    if entry.manifest_path is not None:
        manifest = load_manifest(entry.manifest_path).model_dump(mode="json")
        item["agent_server"] = manifest.get("agent_server")
        item["resources_server"] = manifest.get("resources_server")
        item["sandbox"] = manifest.get("sandbox")
        item["prompt_config"] = manifest.get("standard_prompt_config")
        item["reward_range"] = (manifest.get("reward") or {}).get("range")
        item["higher_is_better"] = (manifest.get("reward") or {}).get("higher_is_better")
        item["datasets"] = [
            {key: dataset.get(key) for key in ("name", "type", "jsonl_fpath", "prompt_config", "num_repeats")}
            for dataset in manifest.get("datasets") or []
        ]
    out.append(item)
json.dump({"nemo_gym": getattr(nemo_gym, "__version__", ""), "entries": out}, sys.stdout)
"""


class CatalogDataset(BaseModel):
    """One dataset an entry names (benchmarks: with their prompt config and repeats)."""

    model_config = ConfigDict(frozen=True)

    name: str
    type: str | None = None
    jsonl_fpath: str | None = None
    prompt_config: str | None = None
    num_repeats: int | None = None


class CatalogEntry(BaseModel):
    """One entry of ``gym list environments``."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: Literal["environment", "benchmark"]
    status: str | None = None
    domain: str | None = None
    description: str | None = None
    integration_profile: str | None = None
    config: str
    """Its config file, relative to the server venv's site-packages."""
    agent: str | None = None
    """The agent server its config pairs with it (``simple_agent``, ``opencode_agent``, ...)."""
    agent_server: str | None = None
    resources_server: str | None = None
    resources_servers: tuple[str, ...] = ()
    """Every resources-server instance its config holds."""
    datasets: tuple[CatalogDataset, ...] = ()
    sandbox: str | None = None
    prompt_config: str | None = None
    reward_range: tuple[float, float] | None = None
    higher_is_better: bool | None = None

    @property
    def short_name(self) -> str | None:
        """``mcqa`` for ``resources_servers/mcqa``: the name this package took before the catalog."""
        short = short_name(self.name)
        return short if self.kind == "environment" and short != self.name else None

    @property
    def data_file(self) -> str | None:
        """Its benchmark dataset's file, relative to the server venv's site-packages."""
        return next((d.jsonl_fpath for d in self.datasets if d.type == "benchmark" and d.jsonl_fpath), None)

    @property
    def num_repeats(self) -> int | None:
        """The repeats of its benchmark dataset (its ``pass@k`` goes up to this k)."""
        return next((d.num_repeats for d in self.datasets if d.type == "benchmark" and d.num_repeats), None)


class _Catalog(BaseModel):
    nemo_gym: str
    entries: tuple[CatalogEntry, ...]


class UnknownCatalogNameError(GymEnvironmentError):
    """A name that is not in NeMo-Gym's catalog; the message names the closest ones."""


def load_catalog(gym: GymVenv) -> tuple[CatalogEntry, ...]:
    """The catalog of ``gym``'s nemo-gym, from the cache beside the venv (read once per venv)."""
    cache = gym_venv_root() / f"{gym.path.name}.catalog.json"
    try:
        return _Catalog.model_validate_json(cache.read_bytes()).entries
    except (OSError, ValidationError):
        pass  # missing or unreadable: ask the registry again and rewrite it
    done = run_in_gym(gym, _READER)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise GymEnvironmentError(f"nemo-gym's registry could not list its catalog in {gym.path}:\n{tail}")
    catalog = _Catalog.model_validate_json(done.stdout)
    write_file(cache, catalog.model_dump_json().encode())
    return catalog.entries


def find(name: str, entries: Sequence[CatalogEntry], kind: str | None = None) -> CatalogEntry:
    """The entry ``name`` (or a short name, ``mcqa``) names; ``UnknownCatalogNameError`` names close ones."""
    pool = [e for e in entries if kind is None or e.kind == kind]
    for matches in (
        [e for e in pool if e.name == name],
        [e for e in pool if e.short_name == name],
        [e for e in pool if name.casefold() in (e.name.casefold(), (e.short_name or "").casefold())],
    ):
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            kinds = " and ".join(f"--kind {e.kind}" for e in matches)
            raise UnknownCatalogNameError(f"{name!r} names {len(matches)} catalog entries: give {kinds}")
    configs = [
        e.name for e in pool if e.name.casefold().startswith((f"{_RESOURCES}{name}/".casefold(), f"{name}/".casefold()))
    ]
    if configs:
        raise UnknownCatalogNameError(f"{name!r} has {len(configs)} configs; give one of: {', '.join(configs)}")
    names = {e.name.casefold(): e.name for e in pool} | {
        e.short_name.casefold(): e.short_name for e in pool if e.short_name
    }
    close = difflib.get_close_matches(name.casefold(), list(names), n=5, cutoff=0.6)
    hint = f"did you mean {', '.join(names[c] for c in close)}?" if close else "no catalog name is close"
    raise UnknownCatalogNameError(
        f"{name!r} is not in NeMo-Gym's catalog ({hint}); `miles-nemogym environments` lists every name"
    )


# ----------------------------------------------------------------------------- what this package does

SIMPLE = "simple_agent: serve --env, played in-process"
JUDGE = "needs a judge (`--judge-url`)"
ROUTED = "routed: serve --env, its agent's /run"
ALONE = "resources server only"
REFUSED = "refused"
NOT_YET = "not served by this package yet"
BENCHMARK_SHIPPED = "benchmark: convert --env NAME (its data ships)"
BENCHMARK_PREPARED = "benchmark: convert --env NAME=FILE (prepared)"


_SHORT = {
    SIMPLE: "in-process",
    ROUTED: "routed",
    JUDGE: "needs a judge",
    ALONE: "no agent",
    REFUSED: "refused",
    NOT_YET: "not yet",
    BENCHMARK_SHIPPED: "eval, data ships",
    BENCHMARK_PREPARED: "eval, prepared file",
}


class Support(BaseModel):
    """What this package does with one catalog entry."""

    model_config = ConfigDict(frozen=True)

    status: str
    agent: str = ""
    """The agent kinds its config pairs with it, as markdown code (``simple_agent``, ...)."""
    needs: str = ""
    """What serving it needs on the host, or why it is refused."""


def _short(reason: str) -> str:
    """A refusal's reason in a table cell."""
    patterns = (
        (r"requirements\.txt line '([^']+)' needs more than PyPI", r"a requirement beyond PyPI: `\1`"),
        (r"ships (\d+) configs in \S+ \(([^)]*)\) and none is named", r"\1 configs, none named after it (\2)"),
        (
            r"holds (\d+) (\S+) resources servers .* no agent playing one.*its agent: ([^;]*)$",
            r"\1 `\2` resources servers, no agent (not in nemo-gym's catalog); serve its config \3",
        ),
        (
            r"its agent '[^']+' \((\w+)\) (builds|posts|re-reads) .*",
            r"its agent `\1` drops the rollout id (nemo-gym 0.7.0)",
        ),
        (r"calls model server '([^']+)', not policy_model", r"an agent of its calls `\1`, not `policy_model`"),
        (r"reads (\S+) .*the nemo-gym 0.7.0 wheel does not ship", r"a file the wheel does not ship: `\1`"),
        (r"its agent \w+: (its CLI[^;]*)", r"\1"),
        (
            r"calls policy_model itself \((\w+)\)",
            r"its resources server calls `policy_model` itself (`\1`), no rollout id",
        ),
        (r"reads the policy's own server \((\w+): ", r"its resources server reads the policy's own server (`\1`)"),
        (
            r"its own driver \(rollout_collection_driver: ([^)]+)\)",
            r"its own rollout driver `\1`, not one `/run` a row",
        ),
    )
    for pattern, replacement in patterns:
        found = re.search(pattern, reason)
        if found:
            return found.expand(replacement)
    return reason


def _fresh_host_needs(config: dict[str, Any]) -> list[str]:
    """What ``config``'s servers need on a fresh host under serve's layer, without their servers' names."""
    judge = Judge(url="http://judge:8000/v1", model="judge")
    bare = config_needs(served(config, judge), {}, which=lambda _: None, cache=False)
    return [need.split(": ", 1)[1] for need in bare]


def support(name: str) -> Support:
    """What ``serve --env NAME`` does with resources server ``name`` as the wheel ships it."""
    try:
        [p] = plan([name])
    except GymEnvironmentError as error:
        return Support(status=REFUSED, needs=_short(str(error)))
    config = plan_config(p)
    agents = sorted({kind for _, group, kind, _ in server_blocks(config) if group == "responses_api_agents"})
    allowed = sorted(
        {str(a) for _, group, _, block in server_blocks(config) if group == "resources_servers"
         for a in block.get("allowed_agents") or ()}
    )  # fmt: skip
    agent = ", ".join(f"`{kind}`" for kind in agents) or "none in its config" + (
        f" (allowed: {', '.join(f'`{a}`' for a in allowed)})" if allowed else ""
    )
    needs = _fresh_host_needs(config)
    settings = [n for n in needs if n.startswith("the setting")]
    refused = refusal(name, config, None)
    if refused and "grades with a judge" not in refused:
        return Support(status=REFUSED, agent=agent, needs=_short(refused))
    contained = _in_task_containers(needs, judged=refused is not None)
    if contained:
        return Support(status=REFUSED, agent=agent, needs=contained)
    if settings:
        keys = ", ".join(f"`{n.split()[2]}`" for n in dict.fromkeys(settings))
        return Support(status=REFUSED, agent=agent, needs=f"settings serve does not set: {keys}")
    extra = [f"PyPI: {len(p.requirements)} requirement{'s' * (len(p.requirements) > 1)}"] if p.requirements else []
    needed = "; ".join(dict.fromkeys([*[n.split(" (", 1)[0] for n in needs], *extra]))  # "a sandbox provider"
    status = JUDGE if refused else SIMPLE if "simple_agent" in agents else ROUTED if agents else ALONE
    return Support(status=status, agent=agent, needs=needed)


def served_name(entry: CatalogEntry) -> str | None:
    """The name ``--env`` takes for a catalog entry (short name, ``catalog_folders``, ``folder_servers``), or None."""
    if entry.short_name is not None:
        return entry.short_name
    if entry.kind != "environment":
        return None
    return entry.name if entry.name in catalog_folders() else folder_servers().get(entry.name)


def benchmark_grader(entry: CatalogEntry) -> tuple[str | None, str]:
    """The ``serve --env`` name that grades benchmark ``entry`` here, or (None, why not)."""
    if entry.kind != "benchmark":
        return None, f"{entry.name!r} is an environment, not a benchmark"
    if _played_by_an_agent(entry):
        found = _agent_benchmark_support(entry)  # not refused: the environment that plays it the same
        return (None, found.needs) if found.status in (REFUSED, NOT_YET) else _agent_grading(entry)
    if grader_settings(entry.config):
        # The environment serving it with its config's settings (``serve --env gpqa``: mcqa with gpqa's grading_mode).
        own = next((key for key, (name, _) in benchmark_environments().items() if name == entry.name), None)
        return own, "" if own else f"its config changes its grader `{entry.resources_server}`; its manifest differs"
    return entry.resources_server, ""


def _runnable(entry: CatalogEntry, agent: str, grader: str, named: str, first: str, more: list[str]) -> Support:
    """A benchmark ``grader`` plays or grades: refused as that environment is, else eval rows and their needs."""
    found = support(grader)
    if found.status == REFUSED:
        return Support(status=REFUSED, agent=agent, needs=f"{named}: {found.needs}")
    shipped = entry.data_file is not None and gym_wheel.ships(entry.data_file)
    needs = [first]
    if not shipped:
        needs.append(f"its prepared file (`gym eval prepare --benchmark {entry.name}`)")
    if found.status == JUDGE:
        needs.append("a judge (`--judge-url`)")
    needs += [need for need in [found.needs, *more] if need and need not in needs]
    return Support(status=BENCHMARK_SHIPPED if shipped else BENCHMARK_PREPARED, agent=agent, needs="; ".join(needs))


def _graded_by(entry: CatalogEntry, grader: str) -> str:
    """Which environment grades a benchmark, and the settings its own config gives that server."""
    changed = grader_settings(entry.config) if grader != entry.resources_server else []
    keys = ", ".join(f"`{key}`" for key in changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return f"graded by `{grader}`" + (f" (`{entry.resources_server}` with its config's {keys})" if changed else "")


def entry_support(entry: CatalogEntry) -> Support:
    """What this package does with a catalog entry (benchmarks as eval rows, environments by :func:`support`)."""
    if entry.kind == "benchmark" and _played_by_an_agent(entry):
        return _agent_benchmark_support(entry)
    if entry.kind == "benchmark":
        grader, why = benchmark_grader(entry)
        if grader is None:
            agent = entry.agent_server or entry.agent
            return Support(status=NOT_YET, agent=f"`{agent}`" if agent else "", needs=why)
        return _runnable(entry, "`simple_agent`", grader, f"its grader `{grader}`", _graded_by(entry, grader), [])
    name = served_name(entry)
    if name is not None:
        return support(name)
    agent = f"`{entry.agent}`" if entry.agent else ""
    refused = refused_folders().get(entry.name)
    if refused:
        return Support(status=REFUSED, agent=agent, needs=_short(refused))
    return Support(status=NOT_YET, agent=agent)


# ----------------------------------------------------------------------------- benchmarks of other agents

# A benchmark config's keys that change nothing of how its server grades or its agent plays.
_LABELS = frozenset({"_inherit_from", "datasets", "resources_server", "description", "value", "domain", "verified"})


_SANDBOX = "a sandbox provider"
_SANDBOXED = "task containers: a sandbox provider (its `sandbox_provider`), which serve does not configure for --env"
# Agents that put images in the policy's prompt (nemo-gym 0.7.0: their app.py embeds them per row).
_IMAGES = {"labbench2_vlm_agent": "figures and tables", "gdp_pdf_agent": "document pages"}


def _in_task_containers(needs: Sequence[str], *, judged: bool, policy: Sequence[str] = ()) -> str | None:
    """Why a config whose ``needs`` name a sandbox provider (never set for ``--env``) is refused, or None."""
    host = list(dict.fromkeys(need.split(" (", 1)[0] for need in needs))
    if _SANDBOX not in host:
        return None
    rest = [need for need in host if need != _SANDBOX]
    return "; ".join([_SANDBOXED, *rest, *(["a judge (`--judge-url`)"] if judged else []), *policy])


def _policy(kind: str) -> list[str]:
    """What the policy itself must be for an agent kind's rows."""
    seen = _IMAGES.get(kind)
    return [f"a vision-language policy (its agent puts {seen} as images in the prompt)"] if seen else []


def _played_by_an_agent(entry: CatalogEntry) -> bool:
    """A benchmark played by another agent than ``simple_agent`` (or naming no resources server)."""
    return entry.agent_server != "simple_agent" or not entry.resources_server


def _changed(block: dict[str, object], base: dict[str, object]) -> list[str]:
    return sorted(key for key, value in block.items() if key not in _LABELS and base.get(key) != value)


def _agent_grading(entry: CatalogEntry) -> tuple[str | None, str]:
    """The environment playing and grading benchmark ``entry`` as its config does, or (None, why not)."""
    kind = entry.agent_server or entry.agent
    server = entry.resources_server
    if not kind or not server:
        return None, "its manifest names no agent or no resources server"
    try:
        [p] = plan([server])
    except GymEnvironmentError as error:
        return None, f"its resources server `{server}`: {_short(str(error))}"
    base = shipped_config(p.config)
    agents = (base.get(p.agent or "") or {}).get("responses_api_agents") or {}  # the agent serve routes to
    if kind not in agents:
        played = next(iter(agents), "simple_agent")
        return None, f"its agent `{kind}` is not the one `serve --env {server}` starts (`{played}`)"
    bases = {
        ("resources_servers", p.resources_server): base[p.instance]["resources_servers"][p.resources_server],
        ("responses_api_agents", kind): agents[kind],
    }
    blocks = server_blocks(shipped_config(entry.config))
    changed = {key for _, g, k, block in blocks if (g, k) in bases for key in _changed(block, bases[g, k])}
    if changed:
        keys = ", ".join(f"`{key}`" for key in sorted(changed))
        return None, f"its config changes what `serve --env {server}` serves ({keys})"
    return server, ""


def _agent_benchmark_support(entry: CatalogEntry) -> Support:
    """What this package does with a benchmark of another agent (docs/environments.md, "Benchmarks of other agents")."""
    kind = entry.agent_server or entry.agent or ""
    agent = f"`{kind}`" if kind else ""
    composed = shipped_config(entry.config)
    refused = config_refusal(entry.name, composed)
    if refused and "grades with a judge" not in refused:
        return Support(status=REFUSED, agent=agent, needs=_short(refused))
    needs = _fresh_host_needs(composed)
    host = list(dict.fromkeys(need.split(" (", 1)[0] for need in needs))
    contained = _in_task_containers(needs, judged=refused is not None, policy=_policy(kind))
    if contained:
        return Support(status=REFUSED, agent=agent, needs=contained)
    grader, why = _agent_grading(entry)
    if grader is None:
        return Support(status=NOT_YET, agent=agent, needs="; ".join([why, *host]))
    played = f"played and graded by `{grader}` (routed to its agent)"
    return _runnable(entry, agent, grader, f"its environment `{grader}`", played, [*host, *_policy(kind)])


@dataclass(frozen=True)
class Listed:
    """A catalog entry and what this package does with it, as ``miles-nemogym environments`` shows it."""

    entry: CatalogEntry
    here: Support
    widest: ClassVar[int] = max(map(len, _SHORT.values()))
    """The longest :attr:`short`, a listing's column width."""

    @property
    def short(self) -> str:
        """:attr:`here`'s status in a listing's column."""
        return _SHORT[self.here.status]

    @property
    def refused(self) -> bool:
        return self.here.status == REFUSED

    @property
    def judged(self) -> bool:
        """An environment ``serve`` serves with a judge."""
        return self.here.status == JUDGE

    @property
    def rows(self) -> str | None:
        """A benchmark's evaluation rows: ``"shipped"``, ``"prepared"`` (``gym eval prepare``), or None."""
        return {BENCHMARK_SHIPPED: "shipped", BENCHMARK_PREPARED: "prepared"}.get(self.here.status)

    @property
    def grader(self) -> str | None:
        """:func:`benchmark_grader`."""
        return benchmark_grader(self.entry)[0]

    @property
    def served(self) -> str | None:
        """The name ``serve --env`` takes for it (:func:`served_name`) when this package serves it."""
        return None if self.here.status in (REFUSED, NOT_YET) else served_name(self.entry)


def listing(name: str | None, kind: str | None, progress: Progress) -> list[Listed]:
    """The entry ``name`` names, else every entry (of ``kind``), each with what this package does with it."""
    gym = cached_gym_venv() or ensure_gym_venv(progress=progress)
    entries = load_catalog(gym)
    chosen = [find(name, entries, kind)] if name else [e for e in entries if kind in (None, e.kind)]
    return [Listed(entry, entry_support(entry)) for entry in chosen]
