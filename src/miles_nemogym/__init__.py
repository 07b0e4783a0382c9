"""miles-nemogym: train Miles RL agents on NVIDIA NeMo-Gym environments.

The hooks Miles loads by dotted path live in their own modules so that importing one
never pulls in the others' dependencies:

- ``miles_nemogym.agent.run`` / ``abort``  -> ``--custom-agent-function-path``
- ``miles_nemogym.reward.reward_func``     -> ``--custom-rm-path``
- ``miles_nemogym.filters.check_episode_group`` -> ``--dynamic-sampling-filter-path``
- ``miles_nemogym.metrics.log_rollout``    -> ``--custom-rollout-log-function-path``
- ``miles_nemogym.salvage.reward_post_process`` -> ``--custom-reward-post-process-path``

This module stays empty of imports on purpose: it is imported before every hook.
"""

__version__ = "0.1.0"
