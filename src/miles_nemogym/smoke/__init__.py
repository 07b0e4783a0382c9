"""``miles-nemogym smoke``: the whole chain on a laptop, on SWE-bench rows (``_swe.py``) or an
environment's shipped rows (``_environments.py``), against the scripted policy (``policy.py``)
playing each row's answers (``answers.py``)."""

from miles_nemogym.smoke._environments import check_environments, run_environment_smoke
from miles_nemogym.smoke._swe import expected_offline, run_smoke

__all__ = ["check_environments", "expected_offline", "run_environment_smoke", "run_smoke"]
