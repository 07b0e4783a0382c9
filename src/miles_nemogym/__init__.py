"""miles-nemogym: train Miles RL agents on NVIDIA NeMo-Gym environments.

The hooks Miles loads by dotted path (``agent.run``/``abort``, ``reward.reward_func``,
``filters.check_episode_group``, ``salvage.reward_post_process``, ``metrics.log_rollout``
/ ``log_eval``) live in their own modules; this one imports nothing, on purpose.
"""

__version__ = "0.1.0"
