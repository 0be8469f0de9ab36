"""What supervisors, load balancers and scrapers probe: /health, /version, /metrics."""

from __future__ import annotations

from http import HTTPStatus

from fastapi import APIRouter
from fastapi.responses import Response

import core
from core import envs
from core.engine.async_llm import AsyncLLM
from core.entrypoints.openai.errors import OpenAIError
from core.metrics import EngineMetrics

__all__ = ["OPEN_PATHS", "SCRAPED_PATHS", "probes_router"]

# Answered without the API key: a supervisor or load balancer has none.
OPEN_PATHS = frozenset({"/health", "/version"})  # SageMaker's /ping becomes /health
# What --metrics-without-api-key opens too.
SCRAPED_PATHS = frozenset({"/metrics"})


def probes_router(engine: AsyncLLM, metrics: EngineMetrics) -> APIRouter:
    """/health (200; 503 once the engine core died, or while it has not been heard from
    for CORE_ENGINE_HEARTBEAT_TIMEOUT_S), /version, and /metrics (`metrics` in Prometheus'
    text format)."""
    router = APIRouter()

    @router.api_route("/health", methods=["GET", "HEAD"])  # load balancers probe with either
    async def health() -> Response:
        engine.check_healthy()
        age = engine.heartbeat_age()
        if age is not None and age > envs.engine_heartbeat_timeout():
            raise OpenAIError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"engine core unresponsive: last heard from {age:.1f} s ago",
                code="engine_unresponsive",
            )
        return Response(status_code=HTTPStatus.OK)

    @router.get("/version")
    async def version() -> dict[str, str]:
        return {"version": core.__version__}

    @router.get("/metrics")
    async def prometheus() -> Response:
        if not engine.is_healthy:  # checked at each scrape: the gauges show the engine now
            metrics.record_engine_death()
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return router
