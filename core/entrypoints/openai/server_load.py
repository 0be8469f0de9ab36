"""vLLM's GET /load: {"server_load": the requests being served}, counted while the server
runs with --enable-server-load-tracking (a load balancer's signal); without it, 0, as in
vLLM. A request counts from its arrival to its last byte sent (a stream until it ends)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["LoadTracking", "ServerLoad", "load_router"]


class ServerLoad:
    def __init__(self) -> None:
        self.in_flight = 0


class LoadTracking:
    """Counts each POST (the API's requests; probes and scrapes are GETs) in `load`."""

    def __init__(self, app: ASGIApp, load: ServerLoad) -> None:
        self.app = app
        self.load = load

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        self.load.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.load.in_flight -= 1


def load_router(load: ServerLoad) -> APIRouter:
    router = APIRouter()

    @router.get("/load")
    async def server_load() -> dict[str, int]:
        return {"server_load": load.in_flight}

    return router
