"""The NeMo-Gym side versions this package is built and tested against.

One place, because three features depend on them agreeing: ``serve`` builds the
server's virtual environment from them, the tests read the real examples shipped in
that exact wheel, and the README promises them to users.
"""

NEMO_GYM_VERSION = "0.7.0"
MINI_SWE_AGENT_VERSION = "2.1.0"
SWEBENCH_VERSION = "4.1.0"
GYM_PYTHON = "3.13"
"""NeMo-Gym >= 0.5 declares Requires-Python >= 3.13.14; 3.13.0 runs it."""
