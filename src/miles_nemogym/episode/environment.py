"""One episode of a ``NEMO_GYM_ENVS`` environment: which rows, and the ``simple_agent`` loop
run as an abortable episode behind its resources server's circuit.

``route`` reads the row: a ``nemogym_env`` mark naming a ``NEMO_GYM_ENVS`` environment, or
NeMo-Gym's own ``agent_ref`` naming one (``<env>`` or ``<env>_simple_agent``); anything else
is a SWE row for ``/run``. ``build_episode`` then ``run_environment`` mirror ``build_body``
then ``run_body``: the row sent to ``/seed_session`` and ``/verify`` is ``task_row`` (no
marks, no Miles bookkeeping, no keys we returned), and the loop's ``EpisodeResult`` becomes
the same ``Outcome`` a ``/run`` episode gives (docs/environments.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic_core

from miles_nemogym import failure_kinds as fk
from miles_nemogym.episode.circuit import circuit
from miles_nemogym.episode.outcome import Outcome, check_reward, failure, short_reason
from miles_nemogym.episode.record import AGENT_SUFFIX, ENV_KEY, SWE_ENVIRONMENT, EpisodeRecord, task_id_of
from miles_nemogym.episode.request import RequestBuildError, check_session_url, task_row
from miles_nemogym.episode.send import Undelivered, environment_connections, run_attempts
from miles_nemogym.settings import EnvironmentServer, Settings, SettingsError
from miles_nemogym.simple_agent import EpisodeResult, Limits, run_episode

__all__ = ["AGENT_REF_KEY", "EnvironmentEpisode", "build_episode", "route", "run_environment"]

AGENT_REF_KEY = "agent_ref"
"""NeMo-Gym's row field naming the agent that runs it: ``{"type": "responses_api_agents", "name": ...}``."""
_AGENT_TYPE = "responses_api_agents"

# /verify echoes the request; these are the loop's own fields, not the environment's.
_VERIFY_OWN = frozenset({"response", "reward", "mask_sample", "failure_kind", "failure_reason"})


def route(metadata: Mapping[str, Any] | None, settings: Settings) -> tuple[str, EnvironmentServer | None]:
    """(environment name, its resources server) of a sample's row; (``swe``, None) for a row
    of ``NEMO_GYM_URL``'s ``/run``. ``SettingsError`` for a row marked with an environment
    ``NEMO_GYM_ENVS`` does not name."""
    if not isinstance(metadata, Mapping):
        return SWE_ENVIRONMENT, None
    servers = settings.environments
    if ENV_KEY in metadata:
        name = metadata[ENV_KEY]
        if not isinstance(name, str) or not name:
            raise RequestBuildError(
                f"metadata[{ENV_KEY!r}] must name an environment of NEMO_GYM_ENVS, got {name!r}; "
                "convert the data with `miles-nemogym convert`"
            )
        if name == SWE_ENVIRONMENT:
            return name, None
        server = servers.get(name)
        if server is None:
            raise SettingsError(_unknown_environment(name, servers))
        return name, server
    name = _agent_ref_environment(metadata.get(AGENT_REF_KEY), servers)
    return (SWE_ENVIRONMENT, None) if name is None else (name, servers[name])


def _agent_ref_environment(ref: Any, servers: Mapping[str, EnvironmentServer]) -> str | None:
    """The ``NEMO_GYM_ENVS`` name a NeMo-Gym ``agent_ref`` points to, if any."""
    if not isinstance(ref, Mapping) or ref.get("type") != _AGENT_TYPE:
        return None
    agent = ref.get("name")
    if not isinstance(agent, str):
        return None
    for name in (agent, agent.removesuffix(AGENT_SUFFIX)):
        if name in servers:
            return name
    return None


def _unknown_environment(name: str, servers: Mapping[str, EnvironmentServer]) -> str:
    configured = f"it names {', '.join(sorted(servers))}" if servers else "it is unset"
    return (
        f"the row is marked {ENV_KEY}={name!r}, an environment NEMO_GYM_ENVS does not name ({configured}); "
        f'add it, e.g. NEMO_GYM_ENVS=\'{{"{name}": "http://<its resources server>"}}\' '
        f"(`miles-nemogym serve --env {name}` prints the setting), or train on data of the configured environments"
    )


@dataclass(frozen=True)
class EnvironmentEpisode:
    """One environment episode, checked before anything is sent."""

    environment: str
    server: EnvironmentServer
    row: dict[str, Any]
    """The task row as the resources server gets it (``task_row``)."""
    task_id: str | None
    session_url: str
    request_kwargs: Mapping[str, Any] | None


def build_episode(
    metadata: Mapping[str, Any] | None,
    environment: str,
    server: EnvironmentServer,
    *,
    session_url: str,
    request_kwargs: Mapping[str, Any] | None,
) -> EnvironmentEpisode:
    """The episode of a routed row; ``RequestBuildError``/``PolicyUrlError`` name what is wrong."""
    if not isinstance(metadata, Mapping):
        raise RequestBuildError(f"sample metadata must be a dict holding the task row, got {type(metadata).__name__}")
    if request_kwargs is not None and not isinstance(request_kwargs, Mapping):
        raise RequestBuildError(
            f"request_kwargs must be a dict of sampling parameters, got {type(request_kwargs).__name__}"
        )
    check_session_url(session_url)
    return EnvironmentEpisode(
        environment=environment,
        server=server,
        row=task_row(metadata),
        task_id=task_id_of(metadata),
        session_url=session_url,
        request_kwargs=request_kwargs,
    )


async def run_environment(episode: EnvironmentEpisode, settings: Settings) -> Outcome:
    """Run ``episode``'s loop: abortable (``abort_all``), waiting while its resources server is
    unreachable before anything was delivered, never raising for a failed episode."""
    connections = await environment_connections()
    limits = Limits(max_steps=episode.server.max_steps, connect_timeout_s=settings.connect_timeout_s)
    key = settings.policy_api_key.get_secret_value() if settings.policy_api_key else None
    tool_time = 0.0

    async def attempt() -> Outcome | Undelivered:
        nonlocal tool_time
        result = await run_episode(
            episode.row,
            session_url=episode.session_url,
            resources_url=episode.server.url,
            request_kwargs=episode.request_kwargs,
            limits=limits,
            api_key=key,
            connections=connections,
        )
        tool_time += result.total_tool_time
        if result.undelivered:
            return Undelivered(result.failure_kind or fk.TRANSPORT_UNREACHABLE, result.failure_reason or "")
        return _outcome(result, episode, settings)

    server = circuit.for_url(episode.server.url, "NEMO_GYM_ENVS")
    outcome = await run_attempts(attempt, server, settings, episode.task_id)
    outcome.tool_time_s = round(tool_time, 6)
    return outcome


def _outcome(result: EpisodeResult, episode: EnvironmentEpisode, settings: Settings) -> Outcome:
    """The ``Outcome`` of a finished loop: masked under its kind, or the verifier's reward when
    finite and in ``NEMO_GYM_REWARD_RANGE`` (else ``verifier_error``)."""
    verify = result.verify or {}
    report = {key: value for key, value in verify.items() if key not in _VERIFY_OWN and key not in episode.row}
    reward, problem = check_reward(result.reward, settings.reward_range)
    kind = result.failure_kind
    if result.mask_sample:
        kind, problem = kind or fk.VERIFIER_ERROR, result.failure_reason or "the episode failed"
    elif kind is not None and not fk.check_server_kind(kind):
        kind, problem = fk.VERIFIER_ERROR, f"/verify sent an invalid failure_kind ({kind[:60]!r})"
    elif problem is not None:
        kind = fk.VERIFIER_ERROR
    if problem is not None:
        scrubber = settings.key_scrubber()
        reason = problem if scrubber is None else scrubber.scrub_text(problem)
        outcome = failure(kind or fk.VERIFIER_ERROR, reason, eval_report=report, server_reward=reward)
    else:
        record = EpisodeRecord(status="ok", failure_kind=kind, server_reward=reward)
        if result.failure_reason:
            record.failure_reason = short_reason(result.failure_reason)
        outcome = Outcome(reward=reward or 0.0, eval_report=report, record=record)
    outcome.record.turns, outcome.record.tool_calls = result.turns, result.tool_calls
    if result.verify is not None:
        outcome.answer, outcome.answer_is_json = pydantic_core.to_json(result.verify), True
    return outcome
