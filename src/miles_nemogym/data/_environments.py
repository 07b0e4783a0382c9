"""NeMo-Gym environment task rows as Miles prompt rows: a row's environment, task id and prompt (what
``simple_agent`` sends first), and weights as row counts (docs/data-and-checks.md). Pure."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from miles_nemogym.data._schema import FieldProblem
from miles_nemogym.episode.record import (
    AGENT_SUFFIX,
    ENV_KEY,
    ROUTING_KEYS,
    SWE_ENVIRONMENT,
    TASK_ID_KEY,
    agent_environment,
)
from miles_nemogym.settings import environment_name_problem, short_name

__all__ = [
    "EnvironmentInput",
    "chat_prompt",
    "environment_of_row",
    "is_environment_row",
    "named_environment",
    "parse_env_option",
    "to_environment_row",
]

ID_FIELDS = ("id", "uuid", "task_id", "instance_id")
"""Row fields that hold a task's own id, first found wins; a row with none is known by its index."""
_PARAMS = "responses_create_params"
_NOT_COPIED = ROUTING_KEYS | {ENV_KEY, TASK_ID_KEY}


@dataclass(frozen=True)
class EnvironmentInput:
    """One ``--env``: rows of ``source`` for environment ``name`` (None: named by each row), mixed by ``weight``."""

    name: str | None
    source: str
    weight: float | None = None


def parse_env_option(value: str, default_source: str | None) -> EnvironmentInput:
    """``NAME``, ``NAME=SOURCE`` or ``NAME=SOURCE:WEIGHT`` (``NAME`` alone reads ``default_source``,
    i.e. ``--input``; ``swe=SOURCE`` is convert's output for SWE-bench rows); ``ValueError`` naming the fix."""
    name, sep, rest = value.partition("=")
    name = short_name(name.strip())  # the catalog's resources_servers/NAME is NAME
    problem = None if name == SWE_ENVIRONMENT and sep else environment_name_problem(name)
    if problem:
        raise ValueError(f"--env {value!r}: environment name {name!r}: {problem}")
    source, weight = rest, None
    head, colon, tail = rest.rpartition(":")
    if colon and head and not os.path.lexists(os.path.expanduser(rest)):  # else a ':' in an existing file's name
        try:
            weight = float(tail)
        except ValueError:
            weight = math.nan
        source = head
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(
                f"--env {value!r}: the weight must be a number > 0 (got {tail!r} after the last ':'); "
                "use --env NAME=FILE[:WEIGHT], e.g. mcqa=mcqa.jsonl:0.5"
            )
    if not sep:
        if default_source is None:
            raise ValueError(f"--env {value!r}: give its rows as NAME=FILE[:WEIGHT], or pass --input FILE")
        source = default_source
    elif not source:
        raise ValueError(f"--env {value!r}: no file after '='; use NAME=FILE[:WEIGHT]")
    return EnvironmentInput(name, source, weight)


def is_environment_row(row: Mapping[str, Any]) -> bool:
    """Has ``responses_create_params`` and names an agent, or has no ``instance_id`` (unlike a SWE-bench row)."""
    return _PARAMS in row and ("agent_ref" in row or "task_source" in row or "instance_id" not in row)


def named_environment(row: Mapping[str, Any]) -> str | None:
    """The environment a raw NeMo-Gym task row names (``"an environment"`` when it names none), or
    None for a row that is not one (NeMo-Gym's SWE rows carry ``agent_ref`` too, and an ``instance_id``)."""
    if not is_environment_row(row) or "instance_id" in row:
        return None
    named = environment_of_row(row)
    return named if isinstance(named, str) else "an environment"


def environment_of_row(row: Mapping[str, Any]) -> str | FieldProblem:
    """The environment a row names through ``agent_ref.name`` or ``task_source`` (what NeMo-Gym's
    data preparation writes in 0.7.0), ``X_simple_agent`` → ``X``; or why it names none."""
    ref = row.get("agent_ref")
    field, agent = ("agent_ref.name", ref.get("name")) if isinstance(ref, Mapping) else ("task_source", None)
    if agent is None:
        agent = row.get("task_source")
        field = "task_source"
    if agent is None:
        return FieldProblem(
            "agent_ref", "missing", "is missing (nothing names the environment); name it with --env NAME (and --input)"
        )
    name = agent_environment(agent)  # the rule the agent function routes by
    if name is not None:
        return name
    if not isinstance(agent, str) or not agent.endswith(AGENT_SUFFIX):
        return FieldProblem(
            field,
            "not_simple_agent",
            f"is {agent!r}, not a '<environment>{AGENT_SUFFIX}', so it does not name the environment; "
            "name it with --env NAME (and --input): rows of an environment played by another agent "
            "(gymnasium_agent, ...) run through that agent's /run (`miles-nemogym serve --env NAME` starts it)",
        )
    bare = agent.removesuffix(AGENT_SUFFIX)
    return FieldProblem(field, "bad_value", f"{agent!r} gives environment {bare!r}: {environment_name_problem(bare)}")


def task_key(row: Mapping[str, Any], index: int) -> str:
    """The row's own id (first of ``ID_FIELDS`` that is a str or int), else its index; a task id is ``env/key``."""
    for field in ID_FIELDS:
        value = row.get(field)
        if (isinstance(value, str) and value) or (isinstance(value, int) and not isinstance(value, bool)):
            return str(value)
    return str(index)


def chat_prompt(row: Mapping[str, Any]) -> list[dict[str, Any]] | FieldProblem:
    """The task row's input messages, or why the row cannot run (by the episode's own first-request
    rules, so a row that passes is never masked as ``invalid_request``)."""
    params = row.get(_PARAMS)
    if not isinstance(params, Mapping):
        rule = "missing" if params is None else "wrong_type"
        return FieldProblem(_PARAMS, rule, 'must be an object holding the task\'s "input", e.g. {"input": [...]}')
    if params.get("input") in (None, "", []):
        return FieldProblem(
            f"{_PARAMS}.input",
            "missing",
            "is missing or empty: the model would get no prompt (rows filled from a prompt_config at "
            "preparation: convert the prepared file)",
        )
    # Imported here: the episode module brings aiohttp, which readers of rows never need.
    from miles_nemogym.episode.environment import first_request
    from miles_nemogym.errors import RequestError

    try:
        prompt, _ = first_request(params, None)  # also the tools and extra_body the episode will send
    except RequestError as error:  # "responses_create_params.<where> <what is wrong>"
        field, _, message = str(error).partition(" ")
        return FieldProblem(field, "unusable", message)
    return prompt


def env_mark_problem(row: Mapping[str, Any], *, swe_row: bool = False) -> FieldProblem | None:
    """Why a row's own ``nemogym_env`` cannot stay (the trainer routes by it): not a non-empty string,
    or on a SWE-bench row (``swe_row``) anything but ``swe``."""
    if ENV_KEY not in row:
        return None
    value = row[ENV_KEY]
    if not isinstance(value, str) or not value:
        return FieldProblem(
            ENV_KEY,
            "wrong_type",
            f"is {value!r}, not an environment's name: the trainer would set every episode of the row aside; "
            "drop the field (convert marks each row itself)",
        )
    if swe_row and value != SWE_ENVIRONMENT:
        return FieldProblem(
            ENV_KEY,
            "bad_value",
            f"is {value!r} on a SWE-bench row: the trainer would send it to environment {value!r}; drop the field",
        )
    return None


def to_environment_row(row: Mapping[str, Any], environment: str, task_id: str) -> dict[str, Any] | FieldProblem:
    """``{"prompt": the input messages, "metadata": {the row…, nemogym_env, nemogym_task_id}}``, or why not."""
    problem = env_mark_problem(row)
    if problem:
        return problem
    prompt = chat_prompt(row)
    if isinstance(prompt, FieldProblem):
        return prompt
    # Routing and secrets come from the trainer's environment, never from data.
    metadata = {key: value for key, value in row.items() if key not in _NOT_COPIED}
    metadata[ENV_KEY] = environment
    metadata[TASK_ID_KEY] = task_id  # last: a repeated copy's suffix is appended to the encoded line
    return {"prompt": prompt, "metadata": metadata}


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` rows split by ``weights`` (largest remainder: counts sum to ``total``, each within 1 of its share)."""
    exact = [Fraction(weight) for weight in weights]  # exact: a share of 5 is never 4.999…
    whole = sum(exact)
    shares = [total * weight / whole for weight in exact]
    counts = [math.floor(share) for share in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: (counts[i] - shares[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts
