"""core: an LLM inference and serving engine.

    from core import LLM, SamplingParams      # offline
    from core import AsyncLLM                 # asyncio apps and servers

Public names are imported on first use, so `core --version` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_PUBLIC = {
    "LLM": "core.entrypoints.llm",
    "SamplingParams": "core.sampling_params",
    "EngineArgs": "core.engine_args",
    "RequestOutput": "core.outputs",
    "CompletionOutput": "core.outputs",
    "EmbeddingOutput": "core.outputs",
    "EmbeddingRequestOutput": "core.outputs",
    "ClassificationRequestOutput": "core.outputs",
    "ScoringRequestOutput": "core.outputs",
    "PoolingRequestOutput": "core.outputs",
    "PoolingParams": "core.pooling.params",
    "LLMEngine": "core.engine.llm_engine",
    "AsyncLLM": "core.engine.async_llm",
    "LoRARequest": "core.lora.request",
}

__all__ = [
    "AsyncLLM",
    "ClassificationRequestOutput",
    "CompletionOutput",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "EngineArgs",
    "LLM",
    "LLMEngine",
    "LoRARequest",
    "PoolingParams",
    "PoolingRequestOutput",
    "RequestOutput",
    "SamplingParams",
    "ScoringRequestOutput",
    "__version__",
]

if TYPE_CHECKING:
    from core.engine.async_llm import AsyncLLM
    from core.engine.llm_engine import LLMEngine
    from core.engine_args import EngineArgs
    from core.entrypoints.llm import LLM
    from core.lora.request import LoRARequest
    from core.outputs import (
        ClassificationRequestOutput,
        CompletionOutput,
        EmbeddingOutput,
        EmbeddingRequestOutput,
        PoolingRequestOutput,
        RequestOutput,
        ScoringRequestOutput,
    )
    from core.pooling.params import PoolingParams
    from core.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'core' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
