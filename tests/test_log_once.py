"""The one "log once" helper."""

from __future__ import annotations

import logging

import pytest

from miles_nemogym import log_once


def test_a_key_is_logged_once_until_reset(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("miles_nemogym.test_log_once")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        assert log_once.log_once(logger, logging.WARNING, "k", "bad value %s", 1)
        assert not log_once.log_once(logger, logging.WARNING, "k", "bad value %s", 2)
        assert log_once.log_once(logger, logging.WARNING, "other", "other")
        log_once.reset()
        assert log_once.log_once(logger, logging.WARNING, "k", "bad value %s", 3)
    assert [r.getMessage() for r in caplog.records] == [
        "bad value 1 [logged once]",
        "other [logged once]",
        "bad value 3 [logged once]",
    ]
