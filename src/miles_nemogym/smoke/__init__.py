"""``miles-nemogym smoke``: the whole chain on a laptop, against the scripted policy (also the golden scan's)."""

from miles_nemogym.smoke._answers import ANSWERED, answers
from miles_nemogym.smoke._environments import check_environments, run_environment_smoke
from miles_nemogym.smoke._policy import RecordingPolicy
from miles_nemogym.smoke._swe import expected_offline, run_smoke

__all__ = [
    "ANSWERED",
    "RecordingPolicy",
    "answers",
    "check_environments",
    "expected_offline",
    "run_environment_smoke",
    "run_smoke",
]
