"""``miles-nemogym smoke``: the whole chain on a laptop, on SWE-bench rows (``_swe.py``) or an
environment's shipped rows (``_environments.py``), against the scripted policy (``_policy.py``)
playing each row's answers (``_answers.py``); a golden scan plays the same answers."""

from miles_nemogym.smoke._answers import answers
from miles_nemogym.smoke._environments import check_environments, run_environment_smoke
from miles_nemogym.smoke._policy import RecordingPolicy
from miles_nemogym.smoke._swe import expected_offline, run_smoke

__all__ = [
    "RecordingPolicy",
    "answers",
    "check_environments",
    "expected_offline",
    "run_environment_smoke",
    "run_smoke",
]
