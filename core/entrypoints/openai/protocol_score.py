"""Request and response bodies of vLLM's /score and /rerank (Jina's and Cohere's rerank shape).

As the other request models (see ``protocol``, whose request base it shares): unknown
fields are ignored, known ones are typed strictly, text must be valid Unicode. How pairs are
made and scored is core.entrypoints.scoring's.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, Field

from core.entrypoints.openai.protocol import UsageInfo, _Request


class ScoreRequest(_Request):
    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    # The one-label cross-encoder's sigmoid (None: on); False gives the raw logit.
    use_activation: bool | None = None


class ScoreResponseData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"score-{uuid.uuid4().hex}")
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreResponseData]
    usage: UsageInfo


class RerankRequest(_Request):
    model: str | None = None
    query: str
    documents: list[str]
    # How many of the best documents to return; 0 (vLLM's default): all of them.
    top_n: int = 0
    return_documents: bool = True
    use_activation: bool | None = None


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int  # the document's position in the request
    document: RerankDocument | None = None  # None: return_documents false
    relevance_score: float


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"rerank-{uuid.uuid4().hex}")
    model: str
    usage: RerankUsage
    results: list[RerankResult]  # best first
