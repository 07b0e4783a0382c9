"""Run the real NeMo-Gym ``mini_swe_agent_2`` server from this package.

``venv`` builds the server's Python 3.13 environment at the pinned versions,
``config`` composes the server config the way NeMo-Gym itself does, and ``server``
starts and stops it. ``miles-nemogym serve``, ``smoke`` and the integration tests all
use this one path, so what the tests prove is what users run.
"""
