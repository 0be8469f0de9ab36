"""OpenAI-style errors: every failure leaves the server as ``{"error": {...}}`` JSON.

The body has OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, so the
``openai`` client raises its usual ``BadRequestError`` / ``NotFoundError``. Bad input is
always a 4xx: OpenAI answers invalid parameters with 400 (not FastAPI's 422), malformed
JSON is a 400 too, and a ValueError raised while serving (the engine's validation) is
the client's fault. A dead engine core is a 503 with code "engine_dead". A stream that
fails after its 200 went out carries the same body as its last SSE event (`as_openai_error`
is the one mapping for both). Only unexpected exceptions are 500, with a generic message
(the details go to the log, not to the client).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from core.engine.core_client import EngineDeadError

__all__ = [
    "OpenAIError",
    "as_openai_error",
    "error_body",
    "error_response",
    "install_error_handlers",
    "validation_error",
]

logger = logging.getLogger(__name__)

# pydantic puts the member of a union that failed into an error's location ("str",
# "list[int]", "function-after[...]", a model class name); they are not request fields.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


class OpenAIError(Exception):
    """An error to answer with ``status`` and an OpenAI error body.

    ``type`` defaults to OpenAI's name for the status class: ``invalid_request_error``
    for 4xx, ``server_error`` for 5xx. ``param`` names the offending request field.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _default_type(status)
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body: of the error response, or of a failed stream's last event."""
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The JSON body of an OpenAI error. A message that quotes input may hold a lone
    surrogate, which a UTF-8 body cannot carry: it is written as its escape, so an error
    about bad input never becomes a 500 (or a stream that breaks off)."""
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def as_openai_error(exc: OpenAIError | EngineDeadError | ValueError) -> OpenAIError:
    """What a failure while serving is answered with, as a response or as a stream's error
    event alike: an OpenAIError as it is; a dead engine core a 503 with code "engine_dead";
    a ValueError (the engine refused the input) a 400."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, EngineDeadError):
        return OpenAIError(
            HTTPStatus.SERVICE_UNAVAILABLE, f"engine unavailable: {exc}", code="engine_dead"
        )
    return OpenAIError(HTTPStatus.BAD_REQUEST, str(exc))


def error_response(error: OpenAIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Make every error of ``app`` an OpenAI error body (see the module docstring)."""
    app.add_exception_handler(OpenAIError, _on_serving_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(EngineDeadError, _on_serving_error)
    app.add_exception_handler(ValueError, _on_serving_error)
    app.add_exception_handler(Exception, _on_unexpected)


async def _on_serving_error(_: Request, exc: OpenAIError | EngineDeadError | ValueError):
    return error_response(as_openai_error(exc))


async def _on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(validation_error(exc.errors()))


async def _on_http_exception(request: Request, exc: HTTPException) -> JSONResponse:
    if exc.status_code == HTTPStatus.NOT_FOUND and exc.detail == HTTPStatus.NOT_FOUND.phrase:
        # Starlette's own "no route matched": say which URL, as OpenAI does.
        message = f"Invalid URL ({request.method} {request.url.path})"
    else:
        message = str(exc.detail)
    return error_response(OpenAIError(exc.status_code, message), headers=exc.headers)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("internal error serving %s %s", request.method, request.url.path)
    return error_response(OpenAIError(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error"))


def validation_error(errors: Sequence[Any]) -> OpenAIError:
    """A 400 for pydantic's errors: the message lists every distinct problem; ``param`` is
    the deepest offending path (``messages[0].content[0].text``), because a value that
    fails every member of a union also fails at the shallow path of the union itself."""
    if any(error.get("type") == "json_invalid" for error in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        reason = (detail.get("ctx") or {}).get("error", detail.get("msg", ""))
        return OpenAIError(HTTPStatus.BAD_REQUEST, f"malformed JSON body: {reason}")
    if any(error.get("loc") == ("body",) and error.get("type") == "missing" for error in errors):
        return OpenAIError(HTTPStatus.BAD_REQUEST, "the request body (a JSON object) is missing")
    params = [_field_path(error.get("loc", ())) for error in errors]
    problems = dict.fromkeys(
        f"{param}: {_reason(error)}" if param else _reason(error)
        for param, error in zip(params, errors, strict=True)
    )
    deepest = max(params, key=lambda p: p.count(".") + p.count("["))
    return OpenAIError(
        HTTPStatus.BAD_REQUEST, "; ".join(problems) or "invalid request", param=deepest or None
    )


def _field_path(loc: Sequence[str | int]) -> str:
    """``("body", "messages", 0, "list[TextPart]", 1, "text")`` -> ``"messages[0][1].text"``."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _is_field_name(part):
            path += f".{part}" if path else part
    return path


def _is_field_name(part: str) -> bool:
    return part.isidentifier() and part[:1].islower() and part not in _TYPE_TAGS


def _reason(error: dict[str, Any]) -> str:
    message = str(error.get("msg", "invalid value"))
    # pydantic prefixes the text of a ValueError raised by our validators.
    return message.removeprefix("Value error, ")


def _default_type(status: int) -> str:
    return "server_error" if status >= 500 else "invalid_request_error"
