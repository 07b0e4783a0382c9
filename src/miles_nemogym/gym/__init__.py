"""Run the real NeMo-Gym ``mini_swe_agent_2`` server from this package."""
