"""``simple_agent``-style episodes run by this package against a NeMo-Gym resources server.

For environments NeMo-Gym drives with its ``simple_agent``: the loop runs here, so every
model call goes to the sample's own policy URL (Miles' session), which ``simple_agent``
cannot do. See docs/environments.md.
"""

from miles_nemogym.simple_agent.connections import Connections
from miles_nemogym.simple_agent.episode import EpisodeResult, Limits, run_episode

__all__ = ["Connections", "EpisodeResult", "Limits", "run_episode"]
