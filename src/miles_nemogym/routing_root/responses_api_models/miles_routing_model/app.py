"""miles-nemogym's routing policy model: NeMo-Gym's ``vllm_model`` whose upstream is chosen per call.

Each call goes to the Miles session its signed rollout id names (``routing_contract.py``), on one of
``session_servers`` (``session_servers.py``), sent once (``_SessionClient``); anything else is refused
with HTTP 403 before anything is sent, and the configured ``base_url`` is never dialled. The key and
the secret come from this process's environment. It replaces ``vllm_model``'s private
``_resolve_client`` (``_check_upstream``). Why each rule: docs/environments.md ("Routed agents").
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from fastapi import HTTPException, Request
from multidict import CIMultiDict, CIMultiDictProxy
from nemo_gym.openai_utils import NeMoGymAsyncOpenAI
from nemo_gym.rollout_correlation import current_rollout_id
from nemo_gym.server_utils import get_global_aiohttp_client, is_nemo_gym_fastapi_entrypoint
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

from routing_contract import SECRET_VARIABLE, is_context_overflow, policy_url_of, secret_problem
from session_servers import SessionServer, forward_problem, parse_session_server

_KEY_VARIABLE = "NEMO_GYM_POLICY_API_KEY"
_CONNECTION_TRIES = 3  # tries to connect to a session server (nothing sent before): no turn runs twice
_RETRY_PAUSE_S = 0.5
# What vllm_model is handed for a context overflow (its own check matches "context length").
_OVERFLOW_BODY = b'{"error": "the session answered: the prompt exceeds the model\'s context length"}'


def _check_upstream() -> None:
    """Fail at start-up unless ``vllm_model`` calls ``_resolve_client(request)`` on every path to the engine."""
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


def _rollout_secret() -> str:
    secret = os.environ.get(SECRET_VARIABLE, "")
    problem = secret_problem(secret)
    if problem:
        raise RuntimeError(
            f"miles_routing_model: {problem}; `miles-nemogym serve` gives this process the secret the trainer "
            "signs rollout ids with (start it through serve)"
        )
    return secret.strip()


_SECRET = _rollout_secret()


class _SessionClient(NeMoGymAsyncOpenAI):
    """One call's session client, each request sent at most once (``_send``); chat answers get the
    ``top_logprobs`` NeMo-Gym's chat model requires (Miles' session server leaves it out)."""

    async def create_chat_completion(self, **kwargs: Any) -> Any:
        answer = await self._send("POST", f"{self.base_url}/chat/completions", kwargs)
        for choice in answer.get("choices") or [] if isinstance(answer, dict) else []:
            logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
            for token in (logprobs or {}).get("content") or [] if isinstance(logprobs, dict) else []:
                if isinstance(token, dict):
                    token.setdefault("top_logprobs", [])
        return answer

    async def create_completion(self, **kwargs: Any) -> Any:
        return await self._send("POST", f"{self.base_url}/completions", kwargs)

    async def create_response(self, **kwargs: Any) -> Any:
        return await self._send("POST", f"{self.base_url}/responses", kwargs)

    async def create_tokenize(self, **kwargs: Any) -> Any:
        return await self._send("POST", f"{self.base_url.removesuffix('/v1')}/tokenize", kwargs)

    async def create_models(self) -> Any:
        return await self._send("GET", f"{self.base_url}/models", None)

    async def _send(self, method: str, url: str, body: dict[str, Any] | None) -> Any:
        """One request, redirects not followed; tried again only when no connection was established
        (``ClientConnectorError``): a later failure may have delivered the call and fails it."""
        headers = {**self.default_headers, "Authorization": f"Bearer {self.api_key}"}
        data = None if body is None else json.dumps(body).encode("utf-8")
        if data is not None:
            headers["Content-Type"] = "application/json"
        session = get_global_aiohttp_client()
        for attempt in range(1, _CONNECTION_TRIES + 1):
            try:
                async with session.request(method, url, data=data, headers=headers, allow_redirects=False) as response:
                    status, content = response.status, await response.read()
                break
            except aiohttp.ClientConnectorError as error:
                if attempt == _CONNECTION_TRIES:
                    raise HTTPException(
                        status_code=502, detail=f"miles_routing_model: cannot connect to the session ({error})"
                    ) from None
                await asyncio.sleep(_RETRY_PAUSE_S)  # a back-off, not a synchronisation
            except aiohttp.ClientError as error:
                raise HTTPException(
                    status_code=502,
                    detail=f"miles_routing_model: the session's connection failed after the call was sent "
                    f"({type(error).__name__}); it is not sent again",
                ) from None
        if 200 <= status < 300:
            try:
                return json.loads(content)
            except ValueError:
                raise HTTPException(
                    status_code=502, detail="miles_routing_model: the session answered no JSON"
                ) from None
        if is_context_overflow(status, content):
            # vllm_model's own cut-off: an empty turn, finish_reason "length" (routing_contract.py).
            where = CIMultiDictProxy(CIMultiDict[str]())
            info = aiohttp.RequestInfo(response.url, method, where, response.url)
            error = aiohttp.ClientResponseError(info, (), status=status, message="context length exceeded")
            error.response_content = _OVERFLOW_BODY  # type: ignore[attr-defined]
            raise error
        said = " (a redirect: not followed)" if 300 <= status < 400 else ""
        raise HTTPException(status_code=502, detail=f"miles_routing_model: the session answered HTTP {status}{said}")


class MilesRoutingModelConfig(VLLMModelConfig):
    session_servers: list[str]
    """``HOST:PORT`` or ``HOST:PORT-PORT`` of each Miles session server a call may go to."""


class MilesRoutingModel(VLLMModel):
    config: MilesRoutingModelConfig

    def _resolve_client(self, request: Request) -> NeMoGymAsyncOpenAI:
        rollout = current_rollout_id()
        url = policy_url_of(rollout, _SECRET) if rollout else None
        if url is None:
            raise HTTPException(
                status_code=403,
                detail="miles_routing_model: the call carries no rollout id the trainer signed for a Miles session "
                "(is run-level token capture on, was /run sent with _ng_rollout_id, and does the trainer export "
                f"the {SECRET_VARIABLE} this serve printed?)",
            )
        own = (str(self.config.host).strip("[]").lower(), int(self.config.port))
        problem = forward_problem(url, _allowed(self.config.session_servers), own)
        if problem:
            raise HTTPException(status_code=403, detail=f"miles_routing_model: rollout {rollout[:64]}: {problem}")
        parts = urlsplit(url)
        return _SessionClient(
            base_url=f"{parts.scheme}://{parts.netloc}{parts.path}",
            api_key=os.environ.get(_KEY_VARIABLE) or "unused",
            default_headers=self.config.default_headers,
        )


def _allowed(entries: list[str]) -> list[SessionServer]:
    allowed = []
    for entry in entries:
        try:
            allowed.append(parse_session_server(entry))
        except ValueError:
            continue  # serve refuses these; a hand-made config's bad entry allows nothing
    return allowed


if __name__ == "__main__":
    MilesRoutingModel.run_webserver()
elif is_nemo_gym_fastapi_entrypoint(__file__):
    app = MilesRoutingModel.run_webserver()
