"""PoolingOutputProcessor: the OutputProcessor of a pooling runner (--runner pooling).

A pooled request reaches the engine core as itself (no n > 1 fan-out) and comes back in
one final EngineCoreOutput holding its pooled values; there is no text to detokenize and
nothing to stream, so each request produces exactly one PoolingRequestOutput, of its task's
kind (an EmbeddingRequestOutput for embed: core.pooling.tasks.task_output). It has the same
methods as OutputProcessor, which the frontend uses for a generate runner, and feeds the
stats listener the same way: one IterationStats per batch of engine-core outputs (a pooled
request counts its prompt tokens when it finishes; it generates none).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from core.engine.output_processor import OutputProcessorOutput, OutputQueue, RequestOutputKind
from core.engine.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
)
from core.engine.stats import IterationStats, RequestStats, StatsListener
from core.outputs import PoolingRequestOutput
from core.pooling.tasks import task_output

__all__ = ["PoolingOutputProcessor"]


@dataclass
class _Pending:
    request: EngineCoreRequest
    prompt: str | None
    queue: OutputQueue | None
    stats: RequestStats = field(init=False)

    def __post_init__(self) -> None:
        self.stats = RequestStats(self.request.arrival_time)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    def output(self, values: list[float] | None) -> PoolingRequestOutput:
        params = self.request.pooling_params
        return task_output(
            (params and params.task) or "embed",
            self.request.request_id,
            self.prompt,
            self.request.prompt_token_ids,
            values,
        )


class PoolingOutputProcessor:
    """Turns the engine core's pooled values into PoolingRequestOutputs."""

    def __init__(self, stats_listener: StatsListener | None = None) -> None:
        self._stats_listener = stats_listener
        self._pending: dict[str, _Pending] = {}

    def add_request(
        self,
        request: EngineCoreRequest,
        prompt: str | None = None,
        output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
        queue: OutputQueue | None = None,
    ) -> list[EngineCoreRequest]:
        """Track a pooled request; return it, the one engine-core request to send. Every
        output kind gets the same single final output."""
        if request.pooling_params is None:
            raise ValueError(f"request {request.request_id!r} has no pooling_params")
        if request.request_id in self._pending:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self._pending[request.request_id] = _Pending(request, prompt, queue)
        return [request]

    def process_outputs(self, engine_core_outputs: EngineCoreOutputs) -> OutputProcessorOutput:
        """Deliver the vector of every finished request; a request the engine core ended
        without one (aborted) gets an output with `outputs` None."""
        result = OutputProcessorOutput(request_outputs=[], reqs_to_abort=[])
        stats = IterationStats.of_step(engine_core_outputs, time.time())
        for output in engine_core_outputs.outputs:
            pending = self._pending.get(output.request_id)
            if pending is not None:
                self._observe(stats, pending, output, engine_core_outputs.timestamp)
            if output.finished:
                self._deliver(output.request_id, output.pooling_output, result.request_outputs)
        for request_id in engine_core_outputs.finished_requests:
            pending = self._pending.get(request_id)
            if pending is not None:
                stats.observe_finished(pending.stats, FinishReason.ABORT, pending.num_prompt_tokens)
            self._deliver(request_id, None, result.request_outputs)
        if self._stats_listener is not None:
            self._stats_listener(stats)
        return result

    @staticmethod
    def _observe(
        stats: IterationStats, pending: _Pending, output: EngineCoreOutput, timestamp: float
    ) -> None:
        stats.observe_output(pending.stats, output, timestamp, pending.num_prompt_tokens)
        if output.finish_reason is not None:
            stats.num_prompt_tokens += pending.num_prompt_tokens
            stats.num_cached_prompt_tokens += output.num_cached_tokens
            stats.observe_finished(pending.stats, output.finish_reason, pending.num_prompt_tokens)

    def abort_requests(self, request_ids: Iterable[str]) -> list[str]:
        """Forget these requests (unknown ones are ignored); return the engine-core ids to
        abort. A request with a queue gets its final output there, so its waiter wakes up."""
        aborted = [request_id for request_id in request_ids if request_id in self._pending]
        stats: dict[int, IterationStats] = {}
        for request_id in aborted:
            pending = self._pending[request_id]
            index = pending.stats.engine_index
            update = stats.setdefault(index, IterationStats(index, timestamp=time.time()))
            update.observe_finished(pending.stats, FinishReason.ABORT, pending.num_prompt_tokens)
            self._deliver(request_id, None, [])
        if self._stats_listener is not None:
            for update in stats.values():
                self._stats_listener(update)
        return aborted

    def has_unfinished_requests(self) -> bool:
        return bool(self._pending)

    def _deliver(self, request_id: str, values: list[float] | None, collected: list) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return
        output = pending.output(values)
        if pending.queue is not None:
            pending.queue.put_nowait(output)
        else:
            collected.append(output)
