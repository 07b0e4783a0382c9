"""Helpers shared by several test modules; not tests themselves.

Servers: ``fault_server`` (``/run`` faults), ``fake_gym`` (``/run`` for the scan, in a thread),
``scripted_gym``, ``openapi`` (``/openapi.json``), ``odd_http`` (hostile HTTP). Miles: ``miles_env``
(its CPU venv), ``miles_harness``, ``miles_driver``, ``megatron_args``, ``qwen3_tokenizer``,
``miles_checkout``. Processes: ``store_writers`` (rollout processes writing a store). Data: ``results``,
``prompt_rows``, ``samples``, ``episode_stores``. Plumbing: ``ports``, ``threaded``, ``agent_fixtures``,
``mini_swe_agent`` (a policy call), ``readme``.
"""
