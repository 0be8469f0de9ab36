"""Request and response bodies of POST /pooling through an IO processor (vLLM's shapes).

The request's `data` is any JSON value: what it must hold is the IO processor's to say
(`IOProcessor.parse_request`). As the other request models (see ``protocol``, whose request
base it shares), unknown fields are ignored and text must be valid Unicode.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from core.entrypoints.openai.protocol import _Request


class IOProcessorRequest(_Request):
    model: str | None = None
    data: Any
    # The id the response carries, and the IO processor's request_id (default: a new one).
    request_id: str | None = None


class IOProcessorResponse(BaseModel):
    request_id: str
    created_at: int = Field(default_factory=lambda: int(time.time()))
    data: Any  # what the IO processor's output_to_response returned
