"""Miles' per-sample hooks: the agent function and the reward it is scored by.

    --custom-agent-function-path miles_nemogym.agent.run   (Miles agentic_tool_call.py)
    async def run(*, base_url, prompt, request_kwargs, metadata) -> {"reward", "eval_report", "nemogym", ...}
    async def abort(args) -> None   # Miles' over-sampling abort: stop every in-flight episode
    --custom-rm-path miles_nemogym.agent.reward_func        (Miles rm_hub/__init__.py)
    async def reward_func(args, sample | [samples]) -> float | [float]

One sample, one episode: prepared by its environment (``prepare_episode``), delivered, then booked
(ledger, reward, salvage hold, store). A failure is recorded on the sample, never raised, and
``reward_func`` never raises (docs/episode-pipeline.md). Importing this stays cheap (no torch, Miles).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pydantic_core

from miles_nemogym.episode.environment import prepare as prepare_environment
from miles_nemogym.episode.record import (
    ENV_KEY,
    REWARD_KEY,
    SWE_ENVIRONMENT,
    UNRECOGNIZED_ENVIRONMENT,
    EpisodeRecord,
    Outcome,
    RecordRead,
    Task,
    failure_of,
    finish,
    finite,
    finite_json,
    metadata_of,
    read_record,
)
from miles_nemogym.episode.run import policy_base_url, prepare_agent, responses_create_params
from miles_nemogym.episode.run import prepare as prepare_run
from miles_nemogym.errors import (
    AGENT_REQUEST_FAILED,
    AGENT_RUN_ERROR,
    INVALID_CONFIG,
    INVALID_REQUEST,
    RequestError,
    SettingsError,
    counted,
    is_registered,
)
from miles_nemogym.groups import hold_failed_episode
from miles_nemogym.runtime import AWAITING_RESULT, NOT_DELIVERED, Episode, Runtime, current, deliver
from miles_nemogym.settings import RewardMode, Settings
from miles_nemogym.store import entry_for, session_id

__all__ = ["ScanEpisodes", "abort", "reward_func", "run", "run_with_settings"]

logger = logging.getLogger(__name__)

# Configuration errors repeat on every sample: each distinct message is logged once.
_CONFIG_KINDS = frozenset({INVALID_CONFIG, AGENT_REQUEST_FAILED, INVALID_REQUEST})


async def run(
    base_url: str,
    prompt: Any = None,
    request_kwargs: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run one NeMo-Gym episode for one Miles sample; see the module docstring."""
    return await run_with_settings(None, base_url=base_url, request_kwargs=request_kwargs, metadata=metadata)


async def run_with_settings(
    given: Settings | None,
    *,
    base_url: str,
    request_kwargs: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    store_extra: Callable[[], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """``run`` with our own callers' settings (smoke; None: the runtime's) and store entry fields (``store_extra``)."""
    runtime = current()
    settings: Settings | None = None
    task = Task.of(metadata)  # the one read of the sample's metadata
    try:
        settings = runtime.settings if given is None else given
        episode = prepare_episode(task, base_url, request_kwargs, settings, runtime.addresses)
    except Exception as error:  # a bad setting, session URL or task row still leaves a record
        outcome = finish(failure_of(error, task.task_id, settings), task.task_id)
    else:
        outcome = await deliver(episode, settings, runtime.circuits, runtime.in_flight)
        if task.environment != SWE_ENVIRONMENT and outcome.tool_time_s is None:
            outcome.tool_time_s = 0.0  # stopped before its loop ran: Miles reads every environment episode's
    record = outcome.record
    record.environment = task.environment
    _log(outcome)
    # The ledger sees every episode, also those whose sample Miles returns without this dict.
    failure_kind = (record.failure_kind or AGENT_RUN_ERROR) if record.mask_sample else None
    runtime.ledger.record_episode(
        failure_kind, task.role, task.eval_set, outcome.outage_wait_s, environment=record.env, aborted=outcome.aborted
    )
    mode = settings.reward_mode if settings is not None else RewardMode.binary
    result = outcome.to_metadata()
    result[REWARD_KEY], _ = score_record(outcome.reward, RecordRead(record), mode)
    hold_failed_episode(runtime.held, task, result, aborted=outcome.aborted)  # Miles drops it without a model call
    if settings is not None and settings.episode_dir:
        _store(runtime, settings, outcome, float(result[REWARD_KEY]), task, base_url, store_extra)
    return result


def prepare_episode(
    task: Task,
    base_url: str,
    request_kwargs: Mapping[str, Any] | None,
    settings: Settings,
    addresses: dict[tuple[str, int], str] | None = None,
) -> Episode:
    """The task's episode, by its environment, for the session ``base_url`` (no ``/v1``); raises what is wrong."""
    environment = task.environment
    if environment == SWE_ENVIRONMENT:
        policy = policy_base_url(base_url, settings.gym_url, settings.external_host, addresses)
        return prepare_run(task, request_kwargs, settings, policy_url=policy, send_api_key=True, session_url=base_url)
    if environment == UNRECOGNIZED_ENVIRONMENT:
        raise RequestError(
            f"metadata[{ENV_KEY!r}] must name an environment (letters, digits, '_', '-' or '.', at most 128, "
            "as NEMO_GYM_ENVS names them); convert the data with `miles-nemogym convert`"
        )
    server = settings.environments.get(environment)
    if server is None:
        servers = settings.environments
        configured = f"it names {', '.join(sorted(servers))}" if servers else "it is unset"
        raise SettingsError(
            f"the row's environment {environment!r} is not in NEMO_GYM_ENVS ({configured}); add it next to the "
            f'others, e.g. NEMO_GYM_ENVS=\'{{"{environment}": "http://<its resources server>"}}\' '
            f"(`miles-nemogym serve --env {environment}` prints the setting), or train on data of the "
            "configured environments; a misspelt name in the rows: re-run `miles-nemogym convert` with the "
            "right --env name (it refuses names nemo-gym does not ship)"
        )
    if server.agent is not None:
        return prepare_agent(task, request_kwargs, server, settings, session_url=base_url, addresses=addresses)
    return prepare_environment(task, server, session_url=base_url, request_kwargs=request_kwargs, settings=settings)


class ScanEpisodes:
    """The scan's episodes for one set of sampling flags, built and run as training's (``RequestError``: bad flags)."""

    def __init__(self, request_kwargs: Mapping[str, Any]) -> None:
        responses_create_params(None, request_kwargs)
        self.request_kwargs = request_kwargs

    def episode(
        self, metadata: Any, environment: str, policy: str | None, settings: Settings, *, send_api_key: bool = False
    ) -> Callable[[], Awaitable[Outcome]]:
        """One row's episode, ready to run: a SWE row's ``/run`` names ``policy`` as its model (None: the
        server's own), an environment row's is ``prepare_episode``'s for the session ``policy``."""
        kwargs = self.request_kwargs
        if environment == SWE_ENVIRONMENT:
            task = Task.of(metadata)
            episode: Episode = prepare_run(task, kwargs, settings, policy_url=policy, send_api_key=send_api_key)
        else:
            episode = prepare_episode(Task.of(metadata, environment), str(policy), kwargs, settings)

        async def play() -> Outcome:
            return await deliver(episode, settings, current().circuits, current().in_flight)

        return play


def _store(
    runtime: Runtime,
    settings: Settings,
    outcome: Outcome,
    reward: float,
    task: Task,
    base_url: str,
    extra: Callable[[], Mapping[str, Any]] | None = None,
) -> None:
    """Hand the episode to the episode store; a store problem never fails the sample."""
    try:
        entry = entry_for(
            record=outcome.record,
            reward=reward,
            role=task.role,
            eval_set=task.eval_set,
            session=session_id(base_url) if isinstance(base_url, str) else None,
            repo=task.repo,
        )
        if extra is not None:
            entry.update(extra())
        answer, is_json = outcome.answer, outcome.answer_is_json
        if isinstance(answer, dict):  # an environment episode's document: encoded only for the store
            answer, is_json = pydantic_core.to_json(finite_json(answer)), True
        scrubber = settings.key_scrubber()
        runtime.stores.get(str(settings.episode_dir)).add(
            task.role, entry, answer, is_json, scrub=None if scrubber is None else scrubber.scrub
        )
    except Exception:
        logger.warning("episode store: could not queue episode %s", outcome.record.episode_id, exc_info=True)


async def abort(args: Any = None) -> None:
    """Miles' over-sampling abort hook: every in-flight episode of this process returns ``cancelled``."""
    runtime = current()
    states = runtime.in_flight.abort_all()
    runtime.held.clear()  # the step's groups have all been filtered
    logger.info(
        "abort: stopped %s: %d sent and awaiting their result "
        "(the server may finish them), %d not yet delivered; each is recorded as cancelled",
        counted(sum(states.values()), "in-flight NeMo-Gym episode"),
        states[AWAITING_RESULT],
        states[NOT_DELIVERED],
    )


def _log(outcome: Outcome) -> None:
    record = outcome.record
    if record.failure_kind is not None and not is_registered(record.failure_kind):
        current().logged.log(
            logger,
            logging.WARNING,
            f"failure_kind {record.failure_kind}",
            "the NeMo-Gym server sent an unregistered failure_kind %r; recorded as is",
            record.failure_kind,
        )
    if record.status == "ok":
        return
    kind = record.failure_kind or "?"
    if outcome.aborted:  # abort() logs one line for all of them
        logger.debug("NeMo-Gym episode cancelled: instance=%s %s", record.instance_id, record.failure_reason)
        return
    if kind in _CONFIG_KINDS:
        message = record.failure_reason or kind
        hint = " — is NEMO_GYM_URL a mini_swe_agent_2 server from nemo-gym >= 0.6?" if record.http_status == 422 else ""
        current().logged.log(
            logger,
            logging.ERROR,
            f"agent {message}",
            "NeMo-Gym %s episodes cannot run (%s): %s%s",
            record.env,
            kind,
            message,
            hint,
        )
        return
    logger.warning(
        "NeMo-Gym episode failed: env=%s instance=%s kind=%s elapsed=%.1fs attempts=%d reason=%s",
        record.env,
        record.instance_id,
        kind,
        record.elapsed_s,
        record.attempts,
        record.failure_reason,
    )


# -- reward_func: the reward hook, over what ``run`` stored (docs/episode-pipeline.md, "Reward") --------

_TEST_COUNTS = frozenset({"fail_to_pass", "pass_to_pass"})


def score_record(reward: Any, read: RecordRead, mode: RewardMode) -> tuple[float, str | None]:
    """(reward, problem or None) of a stored reward and its record (docs/episode-pipeline.md, "Reward")."""
    record = read.record
    if record is not None and record.mask_sample:
        return 0.0, None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return 0.0, "missing_reward" if reward is None else "non_numeric_reward"
    if finite(reward) is None:
        return 0.0, "non_finite_reward"
    # Partial credit reads SWE-bench test counts: an environment's reward is its verifier's.
    if mode is RewardMode.partial and record is not None and record.env == SWE_ENVIRONMENT and not record.resolved:
        if read.unreadable & _TEST_COUNTS:
            return float(reward), "invalid_test_counts"
        return partial_credit(record, float(reward)), None
    return float(reward), None


def partial_credit(record: EpisodeRecord, reward: float) -> float:
    """The partial-credit reward of an unresolved episode (``reward`` without test counts)."""
    if record.fail_to_pass is None or record.pass_to_pass is None:
        return reward
    if record.pass_to_pass.failed:
        return 0.0
    fraction = record.fail_to_pass.fraction
    return reward if fraction is None else fraction


def _score_sample(sample: Any, mode: RewardMode) -> float:
    metadata = metadata_of(sample)
    try:
        value, problem = score_record(metadata.get(REWARD_KEY), read_record(metadata), mode)
    except Exception:  # a record no rule above foresaw: set aside, never crash the rollout
        value, problem = 0.0, "unreadable_record"
    if problem is not None:
        current().reward_problems[problem] += 1
        count = current().reward_problems[problem]
        # The first few, then every 100th: enough to notice, never a flood.
        if count <= 3 or count % 100 == 0:
            instance = str(metadata.get("instance_id"))[:200]
            logger.warning("reward %s for %s: %s (%d so far)", value, instance, problem, count)
    return value


async def reward_func(args: Any, samples: Any, **kwargs: Any) -> float | list[float]:
    """Miles reward hook; see the module docstring."""
    try:
        mode = current().settings.reward_mode
    except SettingsError as error:
        current().logged.log(logger, logging.ERROR, f"reward {error}", "reward hook: %s; scoring in binary mode", error)
        mode = RewardMode.binary
    if isinstance(samples, list):
        return [_score_sample(sample, mode) for sample in samples]
    return _score_sample(samples, mode)
