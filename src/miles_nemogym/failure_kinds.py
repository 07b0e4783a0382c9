"""Failure names the plugin records on a sample: NeMo-Gym's vocabulary, seen from the client.

An episode that did not produce a valid measurement must say so on the sample, under a
name that groups well in metrics and filter reasons. We reuse the names of
``nemo_gym.failure_kinds`` (not imported: the trainer's environment does not install
nemo-gym) so that a failure observed by this client and one reported by the server land
under the same label, and add ``miles_nemogym:<kind>`` names, namespaced as NeMo-Gym
asks, only for what happens before a request exists.

As in NeMo-Gym, a name says what went wrong and nothing else: whether the reward is
masked and whether the request could be retried are decided by the classifier
(``outcome.py``) and the client (``client.py``), per occurrence.
"""

from __future__ import annotations

from typing import Final

# The server could not be reached at all: the request certainly never arrived.
TRANSPORT_UNREACHABLE: Final = "transport_unreachable"
# The connection broke after the request may have been delivered.
TRANSPORT_PEER_DROP: Final = "transport_peer_drop"
# Connecting took longer than the connect timeout.
TRANSPORT_TIMEOUT: Final = "transport_timeout"
# The agent server answered and the episode broke (HTTP 5xx, ``{error, traceback}``,
# an unreadable body).
AGENT_RUN_ERROR: Final = "agent_run_error"
# Something answered but the episode never ran (HTTP 4xx such as a 422 schema error).
AGENT_REQUEST_FAILED: Final = "agent_request_failed"
# The whole-episode deadline (``NEMO_GYM_RUN_TIMEOUT``) passed while waiting.
AGENT_TIMEOUT: Final = "agent_timeout"
# ``abort`` stopped the episode (Miles' over-sampling abort).
CANCELLED: Final = "cancelled"

# Before any request: the task row or sampling parameters cannot form a valid body.
INVALID_REQUEST: Final = "miles_nemogym:invalid_request"
# Before any request: the plugin's configuration (environment variables) is invalid.
INVALID_CONFIG: Final = "miles_nemogym:invalid_config"
# A defect in this plugin surfaced while running the episode (logged with its traceback).
CLIENT_ERROR: Final = "miles_nemogym:client_error"


def metric_label(kind: str) -> str:
    """``kind`` as a metric/filter-reason suffix (``:`` is not safe in every backend)."""
    return kind.replace(":", "_")
