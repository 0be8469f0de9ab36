"""Request and response bodies of POST /pooling (vLLM's shapes): through an IO processor, or
plain pooling of `input`.

An IO-processor request's `data` is any JSON value: what it must hold is the IO
processor's to say (`IOProcessor.parse_request`). A plain request takes /v1/embeddings'
`input` and a pooling `task` (core.pooling.tasks; None: the model's default) with that
task's parameters; each input's `data` is the task's output (a vector, the label
probabilities, a score as a one-value list, or a row per prompt token). As the other
request models (see ``protocol``, whose request base it shares), unknown fields are
ignored and text must be valid Unicode.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from core.entrypoints.openai.protocol import UsageInfo, _Request
from core.entrypoints.openai.protocol_embeddings import InputRequest


class IOProcessorRequest(_Request):
    model: str | None = None
    data: Any
    # The id the response carries, and the IO processor's request_id (default: a new one).
    request_id: str | None = None


class IOProcessorResponse(BaseModel):
    request_id: str
    created_at: int = Field(default_factory=lambda: int(time.time()))
    data: Any  # what the IO processor's output_to_response returned


class PoolingRequest(InputRequest):
    task: str | None = None
    dimensions: int | None = None
    normalize: bool | None = None
    use_activation: bool | None = None
    encoding_format: Literal["float", "base64"] = "float"


class PoolingResponseData(BaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    # The task's output as floats (token-wise: a row per prompt token), or
    # (encoding_format base64) its little-endian float32 bytes, row-major, in base64.
    data: list[float] | list[list[float]] | str


class PoolingResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"pool-{uuid.uuid4().hex}")
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[PoolingResponseData]
    usage: UsageInfo
