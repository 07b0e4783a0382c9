"""What mini-swe-agent 2.1.0 sends to the policy, for stand-ins that play an episode.

``BASH_TOOL`` is its one tool as declared in ``minisweagent/models/utils/actions_toolcall.py``
(mini-swe-agent 2.1.0); ``call_policy`` makes one chat completion the way an episode does.
"""

from __future__ import annotations

from typing import Any

import aiohttp

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
            "required": ["command"],
        },
    },
}


async def call_policy(body: dict[str, Any], turn: int) -> None:
    """One chat completion on the ``/run`` body's ``policy_base_url``, as the NeMo-Gym harness makes it."""
    params = body.get("responses_create_params") or {}
    chat = {
        "model": params.get("model") or "policy",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Fault-server turn {turn + 1} for {body.get('instance_id')}."},
        ],
        "tools": [BASH_TOOL],
    }
    headers = {"Authorization": f"Bearer {body['policy_api_key']}"} if body.get("policy_api_key") else {}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            str(body["policy_base_url"]).rstrip("/") + "/chat/completions", json=chat, headers=headers
        ) as response,
    ):
        response.raise_for_status()
        await response.read()
