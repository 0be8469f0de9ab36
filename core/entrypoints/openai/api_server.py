"""`core serve`: the OpenAI-compatible HTTP server (FastAPI + uvicorn) over AsyncLLM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

import uvicorn
from fastapi import APIRouter, FastAPI

import core
from core import envs
from core.engine.async_llm import AsyncLLM
from core.engine.stat_loggers import listener_of
from core.engine_args import EngineArgs
from core.entrypoints.openai.auth import require_api_key
from core.entrypoints.openai.errors import install_error_handlers
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.entrypoints.openai.lifecycle import (
    ABORT_GRACE_S,
    ServerLifecycle,
    StopSignals,
    UvicornServer,
)
from core.entrypoints.openai.middleware import install_middleware
from core.entrypoints.openai.offload import OffLoop
from core.entrypoints.openai.request_logger import RequestLogger
from core.entrypoints.openai.routers.classify import classify_router
from core.entrypoints.openai.routers.embeddings import embeddings_router
from core.entrypoints.openai.routers.generation import generation_router
from core.entrypoints.openai.routers.lora_adapters import lora_adapter_router
from core.entrypoints.openai.routers.models import models_router
from core.entrypoints.openai.routers.pooling import pooling_router
from core.entrypoints.openai.routers.probes import OPEN_PATHS, SCRAPED_PATHS, probes_router
from core.entrypoints.openai.routers.responses import responses_router
from core.entrypoints.openai.routers.score import score_router
from core.entrypoints.openai.routers.sleep import sleep_router
from core.entrypoints.openai.routers.tokens import tokens_router
from core.entrypoints.openai.sagemaker import pooling_route
from core.entrypoints.openai.server_load import LoadTracking, ServerLoad, load_router
from core.entrypoints.openai.serving import Serving
from core.entrypoints.openai.serving_classify import ServingClassification
from core.entrypoints.openai.serving_embeddings import ServingEmbeddings
from core.entrypoints.openai.serving_models import LoRAModulePath, ServedModels
from core.entrypoints.openai.serving_pooling import ServingPooling
from core.entrypoints.openai.serving_responses import ServingResponses
from core.entrypoints.openai.serving_score import ServingScores
from core.entrypoints.openai.stats_logger import StatsLogger
from core.entrypoints.openai.tool_calls import ToolCalling
from core.metrics import EngineMetrics
from core.plugins.groups import ENDPOINTS
from core.plugins.registry import PluginEntry, get_registry

logger = logging.getLogger(__name__)


def build_app(
    engine: AsyncLLM,
    api_key: str | None = None,
    lora_modules: Sequence[LoRAModulePath] = (),
    frontend: FrontendArgs = FrontendArgs(),
    tool_calling: ToolCalling = ToolCalling(),
) -> FastAPI:
    """The server's app over a started engine. `lora_modules` are served from the start
    (ValueError naming --lora-modules when one cannot be); the runtime adapter routes are
    mounted when LoRA is enabled and CORE_ALLOW_RUNTIME_LORA_UPDATING allows them.
    `frontend`: CORS, request and stats logging (see FrontendArgs); `tool_calling`: the
    --enable-auto-tool-choice / --tool-call-parser settings."""
    models = ServedModels(engine.processor, created=int(time.time()))
    models.add_lora_modules(lora_modules)
    metrics = _listen_to_stats(engine, models, frontend)
    request_logger = RequestLogger(frontend.max_log_len) if frontend.enable_log_requests else None
    offload = OffLoop()
    serving = Serving(
        engine,
        models,
        offload,
        request_logger,
        tool_calling,
        trust_request_chat_template=frontend.trust_request_chat_template,
        content_format=frontend.chat_template_content_format,
        force_include_usage=frontend.enable_force_include_usage,
        prompt_tokens_details=frontend.enable_prompt_tokens_details,
        max_sequences_per_request=frontend.max_sequences_per_request,
    )
    # The app knows --root-path (not uvicorn, which would prefix it to every path): a
    # request reaches its route with the prefix (no proxy in front) or without (a proxy
    # stripped it).
    app = FastAPI(
        title="core",
        version=core.__version__,
        lifespan=_lifespan(offload),
        root_path=frontend.root_path,
    )
    install_error_handlers(app)
    if api_key:
        extra = SCRAPED_PATHS if frontend.metrics_without_api_key else frozenset()
        require_api_key(app, api_key, OPEN_PATHS | extra)
    # Outermost: CORS answers preflights without a key.
    install_middleware(app, frontend, pooling_route(engine.processor.pooling_tasks.supported))
    app.include_router(probes_router(engine, metrics))
    app.include_router(models_router(models))
    app.include_router(generation_router(serving))
    app.include_router(responses_router(ServingResponses(serving)))
    app.include_router(embeddings_router(ServingEmbeddings(engine, models, offload)))
    app.include_router(pooling_router(ServingPooling(engine, models, offload)))
    app.include_router(score_router(ServingScores(engine, models, offload)))
    app.include_router(classify_router(ServingClassification(engine, models, offload)))
    app.include_router(
        tokens_router(engine, serving, offload, frontend.enable_tokenizer_info_endpoint)
    )
    load = ServerLoad()
    app.include_router(load_router(load))
    if frontend.enable_server_load_tracking:
        app.add_middleware(LoadTracking, load=load)
    app.include_router(sleep_router(engine))
    if models.lora_enabled and envs.allow_runtime_lora_updating():
        app.include_router(lora_adapter_router(models, offload))
    _mount_endpoint_plugins(app)
    return app


def _listen_to_stats(
    engine: AsyncLLM, models: ServedModels, frontend: FrontendArgs
) -> EngineMetrics:
    """The engine's stats feed the Prometheus metrics (returned, for /metrics) and, unless
    --disable-log-stats, the periodic log line."""
    metrics = EngineMetrics(models.base_model_name, engine.processor.config, engine.num_gpu_blocks)
    engine.stats_listeners.append(metrics.record)
    if not frontend.disable_log_stats:
        engine.stats_listeners.append(listener_of(StatsLogger()))
    return metrics


def _lifespan(
    offload: OffLoop,
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan: at its end, the OffLoop's thread stops."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        offload.shutdown()

    return lifespan


def _mount_endpoint_plugins(app: FastAPI) -> None:
    """Mount the routers of allowlisted endpoint plugins (denied unless in CORE_PLUGINS)."""

    def mount(entry: PluginEntry, factory: Callable[[], APIRouter]) -> None:
        app.include_router(factory())
        logger.info("mounted endpoint plugin %s from %s", entry.name, entry.distribution)

    get_registry().use_each(ENDPOINTS, mount, "router factory")


async def serve(
    engine_args: EngineArgs,
    host: str | None,
    port: int,
    api_key: str | None,
    lora_modules: Sequence[LoRAModulePath] = (),
    frontend: FrontendArgs = FrontendArgs(),
    tool_calling: ToolCalling = ToolCalling(),
) -> int:
    """Start the engine, then serve HTTP until SIGINT/SIGTERM or the engine core's death
    (core.entrypoints.openai.lifecycle); always stop the engine. The process's exit code:
    0 when stopped by a signal, lifecycle.EXIT_ENGINE_DEAD after the engine core died."""
    if lora_modules and not engine_args.enable_lora:
        # Refused before the engine starts, which may take minutes.
        raise ValueError("--lora-modules: serving LoRA adapters needs --enable-lora")
    if frontend.metrics_without_api_key and not api_key:
        raise ValueError("--metrics-without-api-key: only means something with --api-key")
    with StopSignals() as signals:
        engine = await signals.unless_requested(AsyncLLM.start(engine_args))
        if engine is None:
            return 0
        try:
            app = build_app(engine, api_key, lora_modules, frontend, tool_calling)
            server = UvicornServer(uvicorn_config(app, host, port, frontend))
            ready = asyncio.create_task(_announce(server, host or "0.0.0.0", port, frontend))
            lifecycle = ServerLifecycle(server, engine, signals, frontend.shutdown_timeout)
            exit_code = await lifecycle.run()
            ready.cancel()
        finally:
            engine.shutdown()
    return exit_code


def uvicorn_config(
    app: FastAPI, host: str | None, port: int, frontend: FrontendArgs
) -> uvicorn.Config:
    """uvicorn's settings: the address, TLS, the log level, and how long its shutdown waits
    for open connections (the drain, then the abort grace). --root-path is the app's."""
    return uvicorn.Config(
        app,
        host=host or "0.0.0.0",
        port=port,
        log_level=frontend.uvicorn_log_level,
        ssl_keyfile=frontend.ssl_keyfile,
        ssl_certfile=frontend.ssl_certfile,
        timeout_graceful_shutdown=frontend.shutdown_timeout + ABORT_GRACE_S,
    )


async def _announce(server: uvicorn.Server, host: str, port: int, frontend: FrontendArgs) -> None:
    while not server.started:
        await asyncio.sleep(0.05)
    shown = "127.0.0.1" if host == "0.0.0.0" else host
    url = f"{frontend.scheme}://{shown}:{port}/v1"  # where it listens: a proxy adds root_path
    print(f"core serve: ready at {url}", flush=True)
