"""`core serve`: the OpenAI-compatible HTTP server (FastAPI + uvicorn) over AsyncLLM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from http import HTTPStatus

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

import core
from core import envs
from core.engine.async_llm import AsyncLLM
from core.engine_args import EngineArgs
from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.errors import OpenAIError, error_response, install_error_handlers
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.entrypoints.openai.lifecycle import (
    ABORT_GRACE_S,
    ServerLifecycle,
    StopSignals,
    UvicornServer,
)
from core.entrypoints.openai.middleware import install_middleware
from core.entrypoints.openai.offload import OffLoop
from core.entrypoints.openai.protocol_embeddings import EmbeddingRequest
from core.entrypoints.openai.request_logger import RequestLogger
from core.entrypoints.openai.serving import Serving
from core.entrypoints.openai.serving_embeddings import ServingEmbeddings
from core.entrypoints.openai.serving_models import LoRAModulePath, ServedModels
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
    metrics = EngineMetrics(models.base_model_name, engine.processor.config, engine.num_gpu_blocks)
    engine.stats_listeners.append(metrics.record)
    if not frontend.disable_log_stats:
        engine.stats_listeners.append(StatsLogger().record)
    request_logger = RequestLogger(frontend.max_log_len) if frontend.enable_log_requests else None
    offload = OffLoop()
    serving = Serving(
        engine,
        models,
        offload,
        request_logger,
        tool_calling,
        trust_request_chat_template=frontend.trust_request_chat_template,
    )
    embeddings = ServingEmbeddings(engine, models, offload)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        offload.shutdown()

    app = FastAPI(title="core", version=core.__version__, lifespan=lifespan)
    install_error_handlers(app)
    if api_key:
        extra = _SCRAPED_PATHS if frontend.metrics_without_api_key else frozenset()
        _require_api_key(app, api_key, _OPEN_PATHS | extra)
    install_middleware(app, frontend)  # outermost: CORS answers preflights without a key

    @app.api_route("/health", methods=["GET", "HEAD"])  # load balancers probe with either
    async def health() -> Response:
        engine.check_healthy()
        return Response(status_code=HTTPStatus.OK)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": core.__version__}

    @app.get("/v1/models")
    async def list_models() -> JSONResponse:
        return JSONResponse(p.ModelList(data=models.cards()).model_dump())

    @app.get("/metrics")
    async def prometheus() -> Response:
        if not engine.is_healthy:  # checked at each scrape: the gauges show the engine now
            metrics.record_engine_death()
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.post("/v1/completions")
    async def completions(req: p.CompletionRequest, raw: Request):
        return await serving.completions(req, raw)

    @app.post("/v1/chat/completions")
    async def chat(req: p.ChatCompletionRequest, raw: Request):
        return await serving.chat(req, raw)

    @app.post("/v1/embeddings")
    async def create_embeddings(req: EmbeddingRequest) -> JSONResponse:
        return await embeddings.create(req)

    def tokenized(req: p.TokenizeRequest) -> Response:
        if req.messages is not None:
            tokens = serving.render_chat(req)
        else:
            tokens = engine.tokenizer.encode(req.prompt or "", req.add_special_tokens)
        return _tokenize_response(tokens, engine.processor.max_model_len)

    @app.post("/tokenize")
    async def tokenize(req: p.TokenizeRequest) -> Response:
        serving.check_model(req.model)
        return await offload.run(tokenized, req)

    @app.post("/detokenize")
    async def detokenize(req: p.DetokenizeRequest) -> JSONResponse:
        serving.check_model(req.model)
        bad = [t for t in req.tokens if not 0 <= t < engine.processor.vocab_size]
        if bad:
            raise OpenAIError(
                HTTPStatus.BAD_REQUEST,
                f"token id {bad[0]} is outside the vocabulary",
                param="tokens",
            )
        text = await offload.run(engine.tokenizer.decode, req.tokens)
        return JSONResponse(p.DetokenizeResponse(prompt=text).model_dump())

    if models.lora_enabled and envs.allow_runtime_lora_updating():
        app.include_router(_lora_adapter_router(models))
    _mount_endpoint_plugins(app)
    return app


# Token ids per piece of a /tokenize response (see _tokenize_response).
_IDS_PER_PIECE = 1 << 15


def _tokenize_response(tokens: list[int], max_model_len: int) -> Response:
    """p.TokenizeResponse's JSON, written in pieces: one json.dumps of a million token ids
    holds the GIL for a tenth of a second even on the OffLoop's thread, and the event loop
    waits for it; between pieces of _IDS_PER_PIECE ids it gets its turn."""
    ids = ",".join(
        ",".join(map(str, tokens[i : i + _IDS_PER_PIECE]))
        for i in range(0, len(tokens), _IDS_PER_PIECE)
    )
    body = f'{{"tokens":[{ids}],"count":{len(tokens)},"max_model_len":{max_model_len}}}'
    return Response(body, media_type="application/json")


def _lora_adapter_router(models: ServedModels) -> APIRouter:
    """vLLM's runtime adapter routes (CORE_ALLOW_RUNTIME_LORA_UPDATING). They answer in
    plain text on success, as vLLM's do; the API key guards them like every /v1 route."""
    logger.warning(
        "CORE_ALLOW_RUNTIME_LORA_UPDATING is set: clients can load LoRA adapters from any "
        "path this server can read (a development setting)"
    )
    router = APIRouter()

    @router.post("/v1/load_lora_adapter")
    async def load_lora_adapter(req: p.LoadLoRAAdapterRequest) -> PlainTextResponse:
        models.load_lora(req.lora_name, req.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    @router.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(req: p.UnloadLoRAAdapterRequest) -> PlainTextResponse:
        models.unload_lora(req.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")

    return router


# What a supervisor or load balancer probes: answered without the key.
_OPEN_PATHS = frozenset({"/health", "/version"})
# What --metrics-without-api-key opens too.
_SCRAPED_PATHS = frozenset({"/metrics"})


def _require_api_key(app: FastAPI, api_key: str, open_paths: frozenset[str]) -> None:
    """Every path but `open_paths` needs `Authorization: Bearer <key>` (the scheme
    case-insensitive, RFC 7235); a 401 says which scheme in `WWW-Authenticate`."""

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if request.url.path in open_paths or _bearer_matches(request, api_key):
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


def _bearer_matches(request: Request, api_key: str) -> bool:
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(
        token.strip().encode(), api_key.encode()
    )


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
    """uvicorn's settings: the address, TLS, the root path behind a proxy, the log level,
    and how long its shutdown waits for open connections (the drain, then the abort grace)."""
    return uvicorn.Config(
        app,
        host=host or "0.0.0.0",
        port=port,
        log_level=frontend.uvicorn_log_level,
        root_path=frontend.root_path,
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
