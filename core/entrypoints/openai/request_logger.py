"""RequestLogger (--enable-log-requests): one INFO line per engine request as it is queued.

The line names the request id (the client's X-Request-Id when it sent one), the prompt
text and token ids (each cut to --max-log-len: a log should not hold whole documents),
the sampling parameters and the adapter, so a response can be traced back to its input.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from core.engine.processor import PreparedRequest
from core.lora.request import LoRARequest

__all__ = ["RequestLogger"]

logger = logging.getLogger(__name__)


class RequestLogger:
    def __init__(self, max_log_len: int | None = None) -> None:
        """`max_log_len`: prompt characters and token ids shown (None: all)."""
        self.max_log_len = max_log_len

    def log_inputs(
        self, request_id: str, prepared: PreparedRequest, lora_request: LoRARequest | None
    ) -> None:
        adapter = None if lora_request is None else lora_request.lora_name
        logger.info(
            "Received request %s: prompt: %r, prompt_token_ids: %s, params: %s, lora: %s",
            request_id,
            self._cut(prepared.prompt),
            self._cut(prepared.prompt_token_ids),
            prepared.params,
            adapter,
        )

    def _cut(self, value: str | Sequence[int] | None) -> str | Sequence[int] | None:
        if value is None or self.max_log_len is None:
            return value
        return value[: self.max_log_len]
