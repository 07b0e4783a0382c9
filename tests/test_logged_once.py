"""Messages logged once per Runtime."""

from __future__ import annotations

import logging

import pytest

from miles_nemogym.runtime import LoggedOnce
from tests.support.runtime_settings import UseSettings


def test_a_key_is_logged_once_by_each_memory(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("miles_nemogym.test_log_once")
    logged = LoggedOnce()
    with caplog.at_level(logging.WARNING, logger=logger.name):
        assert logged.log(logger, logging.WARNING, "k", "bad value %s", 1)
        assert not logged.log(logger, logging.WARNING, "k", "bad value %s", 2)
        assert logged.log(logger, logging.WARNING, "other", "other")
        assert LoggedOnce().log(logger, logging.WARNING, "k", "bad value %s", 3)
    assert [r.getMessage() for r in caplog.records] == [
        "bad value 1 [logged once]",
        "other [logged once]",
        "bad value 3 [logged once]",
    ]


async def test_the_hooks_log_a_repeated_configuration_error_through_it(
    caplog: pytest.LogCaptureFixture, use_settings: UseSettings
) -> None:
    from miles_nemogym import agent
    from tests.support.samples import Sample

    use_settings(NEMO_GYM_REWARD_MODE="fractional")
    with caplog.at_level(logging.ERROR, logger="miles_nemogym.agent"):
        for _ in range(3):
            await agent.reward_func(None, Sample(metadata={}))
        use_settings(NEMO_GYM_REWARD_MODE="fractional")  # a new runtime (as between tests) logs it again
        await agent.reward_func(None, Sample(metadata={}))
    lines = [r.getMessage() for r in caplog.records if "NEMO_GYM_REWARD_MODE" in r.getMessage()]
    assert len(lines) == 2 and lines[0].endswith("[logged once]")
