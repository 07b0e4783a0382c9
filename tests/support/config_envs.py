"""The configs of multi-config resources servers the integration tests serve and play by their
catalog names (``tests/integration/test_config_envs.py``)."""

from __future__ import annotations

SERVED = (
    "resources_servers/equivalence_rule/lc",
    "resources_servers/example_single_tool_call/example_single_tool_call_single_agent_turn",
)
"""Catalog names; their short names (``lc``, ...) are the ``NEMO_GYM_ENVS`` keys."""
