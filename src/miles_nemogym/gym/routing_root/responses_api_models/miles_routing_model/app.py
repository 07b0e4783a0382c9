"""miles-nemogym's routing policy model: NeMo-Gym's ``vllm_model`` whose upstream is chosen per call.

Every agent ``miles-nemogym serve`` starts names this server as its ``policy_model``. The trainer
sends each ``/run`` with ``_ng_rollout_id`` = the sample's policy URL (Miles' session URL + ``/v1``,
encoded by ``rollout_ids.py``); the agent prefixes its model calls with ``/ng-rollout/<id>/`` (run-level
token capture, ``token_id_capture.all_agents``), NeMo-Gym's middleware strips the prefix and publishes
the id as ``current_rollout_id()``, and this server sends the call to that session, converting
Responses to chat completions exactly as ``vllm_model`` does (it is ``vllm_model``). A call whose id is
missing, undecodable, or names a host:port outside ``session_servers`` is refused with HTTP 403: there
is no default model. The configured ``base_url`` is never dialled. The policy API key comes from this
process's ``NEMO_GYM_POLICY_API_KEY`` (given to this process alone by ``serve``), never from the config.

It replaces ``vllm_model``'s private ``_resolve_client`` (no public hook chooses the upstream per
call in nemo-gym 0.7.0): docs/upstream.md; ``_check_upstream`` refuses to start if that seam moved.
"""

from __future__ import annotations

import inspect
import os
from typing import Any
from urllib.parse import urlsplit

from fastapi import HTTPException, Request
from nemo_gym.openai_utils import NeMoGymAsyncOpenAI
from nemo_gym.rollout_correlation import current_rollout_id
from nemo_gym.server_utils import is_nemo_gym_fastapi_entrypoint
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

from rollout_ids import policy_url_of

_KEY_VARIABLE = "NEMO_GYM_POLICY_API_KEY"
_CONNECTION_RETRIES = 2
"""A session server that refuses connections fails the call soon (``vllm_model`` default: forever);
a refused connection delivered nothing, so trying again cannot run a turn twice."""
_HTTP_ATTEMPTS = 1
"""A session server's answer is final: an HTTP error is not sent again (the session may already hold
the turn; the in-process loop does not resend either), it fails the agent's ``/run``."""


def _check_upstream() -> None:
    """Fail at start-up, naming the seam, if ``vllm_model`` no longer resolves its client through
    ``_resolve_client(request)`` on every path that calls the engine."""
    resolve = getattr(VLLMModel, "_resolve_client", None)
    if not callable(resolve) or list(inspect.signature(resolve).parameters) != ["self", "request"]:
        raise RuntimeError(
            "miles_routing_model: nemo-gym's vllm_model has no _resolve_client(self, request) any more; "
            "the routing model cannot choose the session per call. Pin nemo-gym 0.7.0 (see docs/upstream.md)."
        )
    for name in ("chat_completions", "_responses_native", "_chat_completions_via_completions_api"):
        method = getattr(VLLMModel, name, None)
        if method is None or "_resolve_client" not in method.__code__.co_names:
            raise RuntimeError(
                f"miles_routing_model: nemo-gym's vllm_model.{name} no longer calls _resolve_client; "
                "a call could reach the configured base_url. Pin nemo-gym 0.7.0 (see docs/upstream.md)."
            )


_check_upstream()


class _SessionClient(NeMoGymAsyncOpenAI):
    """The client of one call's session: its chat answer with ``top_logprobs`` present on each
    token's log-prob (Miles' session server leaves it out; NeMo-Gym's chat model requires it)."""

    async def create_chat_completion(self, **kwargs: Any) -> Any:
        answer = await super().create_chat_completion(**kwargs)
        for choice in answer.get("choices") or [] if isinstance(answer, dict) else []:
            logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
            for token in (logprobs or {}).get("content") or [] if isinstance(logprobs, dict) else []:
                if isinstance(token, dict):
                    token.setdefault("top_logprobs", [])
        return answer


class MilesRoutingModelConfig(VLLMModelConfig):
    session_servers: list[str]
    """``host:port`` of each Miles session server a call may go to (``host`` alone: any port)."""


class MilesRoutingModel(VLLMModel):
    config: MilesRoutingModelConfig

    def _resolve_client(self, request: Request) -> NeMoGymAsyncOpenAI:
        rollout = current_rollout_id()
        url = policy_url_of(rollout) if rollout else None
        if url is None:
            raise HTTPException(
                status_code=403,
                detail="miles_routing_model: the call carries no rollout id naming a Miles session "
                "(is run-level token capture on, and was /run sent with _ng_rollout_id?)",
            )
        problem = _problem(url, self.config.session_servers)
        if problem:
            raise HTTPException(status_code=403, detail=f"miles_routing_model: rollout {rollout[:64]}: {problem}")
        return _SessionClient(
            base_url=url,
            api_key=os.environ.get(_KEY_VARIABLE) or "unused",
            default_headers=self.config.default_headers,
            max_connection_retries=_CONNECTION_RETRIES,
            max_http_attempts=_HTTP_ATTEMPTS,
        )


def _problem(url: str, allowed: list[str]) -> str | None:
    """Why a call may not go to ``url``, or None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "it names no valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        return "it names no plain http(s) URL"
    if parts.query or parts.fragment or not parts.path.rstrip("/").endswith("/v1"):
        return "it names no session URL (.../sessions/<id>/v1)"
    port = port or (443 if parts.scheme == "https" else 80)
    for entry in allowed:
        want = urlsplit(f"//{entry.strip()}")
        if want.hostname == parts.hostname.lower() and want.port in (None, port):
            return None
    return f"{parts.scheme}://{parts.netloc} is not one of the session servers this model serves ({allowed or 'none'})"


if __name__ == "__main__":
    MilesRoutingModel.run_webserver()
elif is_nemo_gym_fastapi_entrypoint(__file__):
    app = MilesRoutingModel.run_webserver()
