"""Helpers shared by several test modules; not tests themselves.

Servers: ``fault_server`` (the ``/run`` stand-in, with faults), ``scripted_gym`` (it, scripted per
episode), ``loopback_gym`` (``GymServer`` around it), ``outage_servers`` (TLS, flapping),
``fake_resources`` (a resources server), ``openapi`` (``/openapi.json``), ``odd_http`` (hostile HTTP).
Miles: ``miles_env`` (its CPU venv), ``miles_harness``, ``miles_driver``, ``megatron_args``,
``qwen3_tokenizer``, ``miles_checkout``. Processes: ``store_writers`` (rollout processes writing a
store). Data: ``results``, ``prompt_rows``, ``samples``, ``episode_stores``. Plumbing: ``ports``,
``threaded``, ``agent_fixtures``, ``mini_swe_agent`` (a policy call), ``readme``.
"""
