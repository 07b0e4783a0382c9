"""A scan of environment rows, each through the agent function's environment path on the ``NEMO_GYM_ENVS`` servers."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from typing import Any

from miles_nemogym import checks
from miles_nemogym.agent import ScanEpisodes
from miles_nemogym.episode.record import Outcome
from miles_nemogym.gym.environments import plan
from miles_nemogym.gym.venv import GymEnvironmentError
from miles_nemogym.scan._inputs import InputError, ScanTask
from miles_nemogym.settings import Settings
from miles_nemogym.smoke import ANSWERED, RecordingPolicy, answers

__all__ = ["CHECK_SESSION", "Answers", "gold_answers", "play_golden", "server_problem", "session_base"]

Answers = dict[str, tuple[Any, ...]]  # a row's scripted turns by answer: {"gold": turns, "wrong": turns}
CHECK_SESSION = "http://127.0.0.1:9/sessions/check"  # checks a golden row's episode before the policy starts


def gold_answers(tasks: Sequence[ScanTask]) -> dict[str, Answers]:
    """Each row's gold and wrong answer, by task id; ``InputError`` for the first row that has none."""
    names = sorted({task.environment for task in tasks})
    try:
        folders = {environment.name: environment.resources_server for environment in plan(names)}
    except GymEnvironmentError as error:
        raise InputError(
            f"a golden scan of environment rows plays the gold answers of environments nemo-gym ships; {error}; "
            "scan your own environment with --policy-base-url"
        ) from None
    found: dict[str, Answers] = {}
    for task in tasks:
        known = answers(folders[task.environment], task.metadata)  # it reads only the gold fields
        if not known:
            raise InputError(
                f"{task.where}: task {task.instance_id}: no gold answer known for {task.environment}'s rows "
                f"(a golden scan reads the gold of {', '.join(ANSWERED)} rows); scan it with --policy-base-url URL "
                "(a model), or see its rows score with `miles-nemogym smoke --env "
                f"{task.environment}`"
            )
        found[task.instance_id] = known
    return found


def session_base(policy_base_url: str) -> str:
    """An API policy's URL without ``/v1``: environment rows post to ``<base>/v1/chat/completions``, as to a session."""
    if not policy_base_url.endswith("/v1"):
        raise InputError(
            f"--policy-base-url {policy_base_url}: environment rows call <it>/chat/completions as "
            "OpenAI-compatible APIs serve it under /v1; give the URL ending in /v1"
        )
    return policy_base_url.removesuffix("/v1")


def server_problem(settings: Settings, environments: Sequence[str], policy_base_url: str | None) -> str | None:
    """An environment scan's gate: its first failure (``NEMO_GYM_ENVS``, a server, the policy), with its fix."""
    missing = [name for name in environments if name not in settings.environments]
    if missing:
        configured = ", ".join(sorted(settings.environments)) or "nothing: it is unset"
        return (
            f"the rows' {'environment' if len(missing) == 1 else 'environments'} {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not in NEMO_GYM_ENVS (it names {configured}); "
            f"start them with `miles-nemogym serve --env {' --env '.join(missing)}` and export the "
            "NEMO_GYM_ENVS it prints"
        )
    target = checks.Target(settings, timeout_s=settings.connect_timeout_s, policy_base_url=policy_base_url)
    policy: list[checks.Wanted] = [] if policy_base_url is None else ["policy answers"]
    results = itertools.chain(checks.run(target, [], environments=environments), checks.run(target, policy))
    failed = next((result for result in results if not result.ok), None)
    return None if failed is None else f"{failed.name}: {failed.detail}; {failed.fix}"


async def play_golden(
    task: ScanTask, known: Answers, policy: RecordingPolicy, settings: Settings, episodes: ScanEpisodes
) -> tuple[Outcome, Outcome]:
    """The row's gold, then its wrong answer, each one episode of its own scripted session."""
    played = []
    for turns in known.values():  # gold, then wrong
        session = uuid.uuid4().hex
        policy.configure_session(session, answers=turns)
        episode = episodes.episode(task.metadata, task.environment, policy.session_url(session), settings)
        outcome = await episode()
        outcome.record.environment = task.environment
        played.append(outcome)
    return played[0], played[1]
