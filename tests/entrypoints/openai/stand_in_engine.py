"""The part of AsyncLLM that `build_app` reads, for server tests that script the engine:
a real InputProcessor (tokenizer, chat template, validation) and no engine core. Each test
subclasses it with the `generate` it needs."""

from __future__ import annotations

from core.engine.core_client import EngineDeadError
from core.engine.processor import InputProcessor


class StandInEngine:
    def __init__(self, processor: InputProcessor) -> None:
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.reasoning_parser = None
        self.stats_listeners: list = []
        self.num_gpu_blocks = None
        self.is_healthy = True
        self.num_requests = 0

    def check_healthy(self) -> None:
        if not self.is_healthy:
            raise EngineDeadError("the stand-in engine core died")

    def heartbeat_age(self) -> float | None:
        return None  # no engine core process to hear from

    def new_request_id(self) -> str:
        self.num_requests += 1
        return f"req-{self.num_requests - 1}"
