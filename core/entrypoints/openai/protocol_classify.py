"""Request and response bodies of vLLM's /classify: one label and its probabilities per input.

The request takes /v1/embeddings' `input` (see ``protocol_embeddings``); the labels are the
checkpoint's id2label.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, Field

from core.entrypoints.openai.protocol import UsageInfo
from core.entrypoints.openai.protocol_embeddings import InputRequest


class ClassificationRequest(InputRequest):
    # The softmax over the labels (a sigmoid for one; None: on); False gives raw logits.
    use_activation: bool | None = None


class ClassificationData(BaseModel):
    index: int
    label: str | None  # the most probable label's name (None: the config names none)
    probs: list[float]
    num_classes: int


class ClassificationResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"classify-{uuid.uuid4().hex}")
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ClassificationData]
    usage: UsageInfo
