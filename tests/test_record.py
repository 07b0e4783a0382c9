"""The episode record: what the agent function writes is what every hook reads back."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from miles_nemogym import agent, metrics
from miles_nemogym.episode.record import (
    REWARD_KEY,
    EpisodeRecord,
    Outcome,
    RecordRead,
    TestCounts,
    check_reward,
    failure,
    parse_record,
    passed,
    read_record,
)
from miles_nemogym.episode.run import classify_http
from miles_nemogym.runtime import Tally
from miles_nemogym.settings import RewardMode
from miles_nemogym.store.views import reward_text
from tests.support.samples import Sample

# A value for every field, none of them the default: a field renamed or retyped on one
# side only (writer, reader, a hook) changes what comes back.
EVERY_FIELD: dict[str, Any] = {
    "status": "ok",
    "episode_id": "e-1",
    "failure_kind": "agent_run_error",
    "failure_reason": "why",
    "mask_sample": True,
    "http_status": 200,
    "attempts": 2,
    "elapsed_s": 12.5,
    "instance_id": "astropy__astropy-12907",
    "server_reward": 0.5,
    "resolved": True,
    "patch_applied": True,
    "fail_to_pass": {"passed": 3, "failed": 1},
    "pass_to_pass": {"passed": 7, "failed": 2},
    "turns": 9,
    "tool_calls": 8,
    "environment": "mcqa",
}


def test_every_field_is_set_in_the_round_trip_fixture() -> None:
    assert set(EVERY_FIELD) == set(EpisodeRecord.model_fields)


def test_a_record_without_an_environment_reads_as_swe() -> None:
    assert EpisodeRecord(status="ok").env == "swe"
    assert EpisodeRecord(status="ok", environment="mcqa").env == "mcqa"


def test_to_metadata_reads_back_as_the_same_record() -> None:
    record = EpisodeRecord.model_validate(EVERY_FIELD)
    metadata = Outcome(reward=0.5, record=record).to_metadata()
    read = read_record(json.loads(json.dumps(metadata)))  # as Miles may store it
    assert read == RecordRead(record)
    assert read.record is not None and read.record.model_fields_set == set(EVERY_FIELD)
    assert read.record.model_dump(mode="json") == EVERY_FIELD


def test_real_results_read_back_and_score_their_reward(gym_example_rollouts: list[dict[str, Any]]) -> None:
    for result in gym_example_rollouts:
        outcome = classify_http(200, json.dumps(result).encode())
        metadata = outcome.to_metadata()
        assert read_record(metadata) == RecordRead(outcome.record)
        assert agent.score_record(metadata[REWARD_KEY], read_record(metadata), RewardMode.binary) == (
            outcome.reward,
            None,
        )


def test_f2p_fraction_is_test_counts_fraction() -> None:
    assert TestCounts(passed=1, failed=3).fraction == 0.25
    assert TestCounts().fraction is None
    record = EpisodeRecord.model_validate({**EVERY_FIELD, "mask_sample": False, "resolved": False, "environment": None})
    record.pass_to_pass = TestCounts(passed=7, failed=0)
    assert agent.partial_credit(record, 0.0) == 0.75
    samples = [Sample(metadata={"nemogym": record.model_dump(mode="json")})]
    assert metrics.rollout_metrics(samples, Tally())["nemogym/fail_to_pass_fraction_mean"] == 0.75


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        ({}, "missing_record"),
        ({"nemogym": None}, "missing_record"),
        ({"nemogym": "ok"}, "not_an_object"),
        (None, "missing_record"),
    ],
)
def test_no_record_says_why(metadata: Any, problem: str) -> None:
    assert read_record(metadata) == RecordRead(None, problem)


def test_wrong_fields_are_named_and_read_as_their_default() -> None:
    read = read_record(
        {"nemogym": {"status": "ok", "attempts": "1", "elapsed_s": math.nan, "turns": -1, "episode_id": ["x"],
                     "fail_to_pass": {"passed": "3", "failed": 1}, "resolved": 1, "extra": object()}}
    )  # fmt: skip
    assert read.unreadable == {"attempts", "elapsed_s", "turns", "episode_id", "fail_to_pass", "resolved"}
    assert read.record == EpisodeRecord(status="ok")


@pytest.mark.parametrize(
    ("fields", "status", "masked", "unreadable"),
    [
        ({"mask_sample": False}, "ok", False, set()),  # no status: it follows mask_sample
        ({"mask_sample": True}, "failed", True, set()),
        ({"mask_sample": "no"}, "failed", True, {"mask_sample"}),  # unknown validity: set aside
        ({"status": "done", "mask_sample": False}, "ok", False, {"status"}),
    ],
)
def test_status_and_mask_sample_are_never_guessed_valid(
    fields: dict[str, Any], status: str, masked: bool, unreadable: set[str]
) -> None:
    read = read_record({"nemogym": fields})
    assert read.record is not None
    assert (read.record.status, read.record.mask_sample, read.unreadable) == (status, masked, frozenset(unreadable))


def test_a_failed_outcome_reads_back_masked_with_its_kind() -> None:
    outcome = failure("transport_peer_drop", "reset")
    read = read_record(outcome.to_metadata())
    assert read.record is not None
    assert (read.record.mask_sample, read.record.failure_kind, read.record.failure_reason) == (
        True,
        "transport_peer_drop",
        "reset",
    )
    assert agent.score_record(1.0, read, RewardMode.partial) == (0.0, None)


def test_a_bare_record_reads_like_one_on_a_sample() -> None:
    bare = {"status": "ok", "attempts": "1", "mask_sample": False}
    assert (
        parse_record(bare)
        == read_record({"nemogym": bare})
        == RecordRead(EpisodeRecord(status="ok"), None, frozenset({"attempts"}))
    )


def test_one_reward_reads_the_same_in_every_view() -> None:
    """Binary rewards with one decimal, a partial one with up to 4 (never rounded to a whole one:
    ``1.0`` is full credit), ``-`` for what is not a number."""
    numbers = (0, 0.0, -0.0, 1, 1.0, 0.5, 0.25, 0.125, 1 / 3, 2 / 3, -1, 1.5, 0.99996, 0.00004, -0.00004)
    assert [reward_text(v) for v in numbers] == [
        "0.0", "0.0", "0.0", "1.0", "1.0", "0.5", "0.25", "0.125", "0.3333", "0.6667", "-1.0", "1.5",
        "0.9999", "0.0001", "-0.0001",
    ]  # fmt: skip
    for other in (None, True, False, "1.0", [1.0], math.nan, math.inf, -math.inf, 10**400):
        assert reward_text(other) == "-", other


NOT_FINITE = (math.nan, math.inf, -math.inf, 10**400, -(10**400))
"""Rewards no rule may take for a number: 10**400 is a JSON integer float() cannot hold."""


@pytest.mark.parametrize("reward", NOT_FINITE, ids=["nan", "inf", "-inf", "huge", "-huge"])
def test_a_reward_that_is_not_finite_is_not_one_in_any_rule(reward: float) -> None:
    """One rule for every reader of a reward: the "passed" rule, the reward hook, the server's
    reward check, the metrics' mean and every view's text (a huge integer once raised
    OverflowError in the "passed" rule, the reward hook and the metrics)."""
    record = EpisodeRecord(status="ok", env="mcqa")
    assert passed(record, reward) is False
    read = read_record({"nemogym": record.model_dump(mode="json")})
    assert agent.score_record(reward, read, RewardMode.partial) == (0.0, "non_finite_reward")
    value, problem = check_reward(reward, (0.0, 1.0))
    assert value is None and problem is not None and "not finite" in problem
    assert reward_text(reward) == "-"

    def reward_means(value: float) -> list[str]:
        samples = [Sample(metadata={"nemogym": record.model_dump(mode="json"), "reward": value}) for _ in range(2)]
        return [key for key in metrics.rollout_metrics(samples, Tally()) if key.endswith("reward_mean")]

    assert reward_means(1.0) and not reward_means(reward)
