"""Request and response bodies of POST /v1/embeddings (OpenAI's, with vLLM's id and created).

As the other request models (see ``protocol``, whose request base it shares): unknown
fields are ignored, known ones are typed strictly, text must be valid Unicode; ranges that
PoolingParams checks (``dimensions``) are left to it.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from core.entrypoints.openai.protocol import _Request

TokenId = Annotated[int, Field(ge=0)]


class InputRequest(_Request):
    """A request of one pooled output per prompt of `input` (/v1/embeddings, /classify,
    /pooling)."""

    model: str | None = None
    # A text, texts, a prompt's token ids, or several prompts' token ids.
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    user: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """One prompt per output to return, in order."""
        given = self.input
        if isinstance(given, str) or given and isinstance(given[0], int):
            return [given]  # type: ignore[list-item]
        return list(given)  # type: ignore[arg-type]


class EmbeddingRequest(InputRequest):
    dimensions: int | None = None  # Matryoshka: keep the first n values
    encoding_format: Literal["float", "base64"] = "float"


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    # The vector's float32 values, or (encoding_format base64) their little-endian bytes
    # in base64.
    embedding: list[float] | str
    index: int


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"embd-{uuid.uuid4().hex}")
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage
