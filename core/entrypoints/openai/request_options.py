"""What a generation request asks of the engine besides its prompts and sampling: the
request id, the scheduling priority and the prefix-cache salt.

- The id is the client's `X-Request-Id` header when it sent one (vLLM's behaviour; it is
  echoed on the response by middleware.RequestIdEcho), else one the engine picks. Each
  prompt of the request runs as `ID-INDEX`; two requests in flight with the same id are
  refused (400), never mixed up.
- `priority` (lower runs first) is honoured with `--scheduling-policy priority`; under
  fcfs a nonzero priority is a 400 naming it, as vLLM answers, rather than ignored.
- `cache_salt` keys the request's first KV block, so requests with different salts never
  share prefix-cache entries (per-tenant isolation).
- `kv_transfer_params` goes to the server's KV connector; without one (no
  --kv-transfer-config) it is a 400 naming it, not ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

from fastapi import Request

from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.middleware import REQUEST_ID_HEADER
from core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

__all__ = ["EngineRequestOptions", "engine_request_options"]


@dataclass(frozen=True)
class EngineRequestOptions:
    request_id: str | None = None  # the client's X-Request-Id; None: the engine picks one
    priority: int = 0
    cache_salt: str | None = None


def engine_request_options(
    req: CompletionRequest | ChatCompletionRequest,
    raw: Request,
    policy: str,
    kv_connector: str | None = None,
) -> EngineRequestOptions:
    """The request's options under the server's scheduling `policy` (fcfs or priority)
    and its KV connector (None: none)."""
    if req.kv_transfer_params is not None and kv_connector is None:
        raise OpenAIError(
            HTTPStatus.BAD_REQUEST,
            "kv_transfer_params: this server has no KV connector (start it with "
            "--kv-transfer-config)",
            param="kv_transfer_params",
        )
    if req.priority != 0 and policy != "priority":
        raise OpenAIError(
            HTTPStatus.BAD_REQUEST,
            f"priority {req.priority}: priority scheduling is not enabled (start the server "
            "with --scheduling-policy priority)",
            param="priority",
        )
    return EngineRequestOptions(
        request_id=raw.headers.get(REQUEST_ID_HEADER),
        priority=req.priority,
        cache_salt=req.cache_salt,
    )
