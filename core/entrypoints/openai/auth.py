"""--api-key: every route but the open ones needs `Authorization: Bearer <key>`."""

from __future__ import annotations

import secrets
from collections.abc import Set
from http import HTTPStatus

from fastapi import FastAPI, Request

from core.entrypoints.openai.errors import OpenAIError, error_response

__all__ = ["require_api_key", "route_path"]


def require_api_key(app: FastAPI, api_key: str, open_paths: Set[str]) -> None:
    """Every path but `open_paths` needs `Authorization: Bearer <key>` (the scheme
    case-insensitive, RFC 7235); a 401 says which scheme in `WWW-Authenticate`."""

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if route_path(request) in open_paths or _bearer_matches(request, api_key):
            return await call_next(request)
        response = error_response(
            OpenAIError(
                HTTPStatus.UNAUTHORIZED,
                "Incorrect or missing API key.",
                type="authentication_error",
                code="invalid_api_key",
            )
        )
        response.headers["WWW-Authenticate"] = "Bearer"
        return response


def route_path(request: Request) -> str:
    """The path the routes see: without --root-path's prefix when the client sent it."""
    path, root = request.url.path, request.scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _bearer_matches(request: Request, api_key: str) -> bool:
    # compare_digest: how long the comparison takes says nothing about the key.
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(
        token.strip().encode(), api_key.encode()
    )
