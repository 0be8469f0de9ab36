"""vLLM's runtime adapter routes, /v1/load_lora_adapter and /v1/unload_lora_adapter,
mounted only when CORE_ALLOW_RUNTIME_LORA_UPDATING allows them."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.offload import OffLoop
from core.entrypoints.openai.serving_models import ServedModels

__all__ = ["lora_adapter_router"]

logger = logging.getLogger(__name__)


def lora_adapter_router(models: ServedModels, offload: OffLoop) -> APIRouter:
    """The routes over `models`. They answer in plain text on success, as vLLM's do; the
    API key guards them like every /v1 route. Loading reads and checks the adapter's files
    (bounded: core-lora's limits) on `offload`'s thread, never on the event loop."""
    logger.warning(
        "CORE_ALLOW_RUNTIME_LORA_UPDATING is set: clients can load LoRA adapters from any "
        "path this server can read (a development setting)"
    )
    router = APIRouter()

    @router.post("/v1/load_lora_adapter")
    async def load_lora_adapter(req: p.LoadLoRAAdapterRequest) -> PlainTextResponse:
        await offload.run(models.load_lora, req.lora_name, req.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    @router.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(req: p.UnloadLoRAAdapterRequest) -> PlainTextResponse:
        models.unload_lora(req.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")

    return router
