"""miles-nemogym: train Miles RL agents on NVIDIA NeMo-Gym environments.

The hooks Miles loads by dotted path live in their own modules: per sample ``agent.run``,
``agent.abort`` and ``agent.reward_func``; per group ``groups.check_episode_group`` and
``groups.reward_post_process``; per step ``metrics.log_rollout`` / ``log_eval``; fully async
``buffer.EpisodeBuffer``. This one imports nothing, on purpose.
"""

__version__ = "0.1.0"
