"""The Executor: how the engine core reaches its workers (in-process, processes, Ray)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from core.config import EngineConfig
from core.kv_cache.budget import MemoryProfile
from core.kv_cache.layout import KVCacheConfig
from core.kv_cache.spec import KVCacheSpec
from core.kv_transfer.aggregator import KVOutputAggregator
from core.worker.contract import ModelRunnerOutput, SchedulerOutput


class Executor(ABC):
    """Runs the same call on every worker and gathers the results.

    `collective_rpc(method, args, kwargs, reply_ranks)` calls `method` on each worker (a
    Worker method name) and returns the results of `reply_ranks` (default: every rank) in
    rank order. The other methods are that call with a fixed method name; `execute_model`
    returns the output of `output_rank`, the first tensor-parallel rank of the last
    pipeline stage: it sampled (and every rank of that stage samples the same tokens).
    With a KV connector and several ranks, a step's output is needed from every rank
    (`step_reply_ranks`): each reports its own transfers, and `step_output` gathers them.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # Called (from a monitor thread) with the reason when the executor can no longer
        # run steps, e.g. a worker process died: the engine-core process stops at once
        # instead of at its next step. None: the next call raises instead.
        self.on_failure: Callable[[str], None] | None = None
        world_size = config.parallel.world_size
        self._kv_outputs = (
            KVOutputAggregator(world_size)
            if config.kv_transfer.kv_connector is not None and world_size > 1
            else None
        )

    @abstractmethod
    def collective_rpc(
        self,
        method: str,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        reply_ranks: tuple[int, ...] | None = None,
    ) -> list[Any]: ...

    @property
    def output_rank(self) -> int:
        parallel = self.config.parallel
        return (parallel.pipeline_parallel_size - 1) * parallel.tensor_parallel_size

    def step_reply_ranks(self) -> tuple[int, ...]:
        """The ranks whose `execute_model` outputs a step needs."""
        if self._kv_outputs is None:
            return (self.output_rank,)
        return tuple(range(self.config.parallel.world_size))

    def step_output(self, replies: list[ModelRunnerOutput]) -> ModelRunnerOutput:
        """The step's output from the replies of `step_reply_ranks()`, in that order: the
        output rank's, with every rank's KV connector report gathered into one."""
        if self._kv_outputs is None:
            return replies[0]
        output = replies[self.output_rank]
        output.kv_connector_output = self._kv_outputs.aggregate(
            [reply.kv_connector_output for reply in replies]
        )
        return output

    def get_kv_cache_specs(self) -> list[dict[str, KVCacheSpec]]:
        """Each rank's attention layers' specs, in rank order (pipeline stages differ)."""
        return self.collective_rpc("get_kv_cache_spec")

    def profile_memory(self) -> list[MemoryProfile]:
        """Each rank's device memory without the KV cache (Worker.profile_memory), in rank
        order; every rank runs its profiled forward at once."""
        return self.collective_rpc("profile_memory")

    def initialize_kv_cache(self, kv_cache_configs: list[KVCacheConfig]) -> None:
        """Give rank r the cache of `kv_cache_configs[r]`."""
        self.collective_rpc("initialize_kv_cache_of_rank", (kv_cache_configs,))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        replies = self.collective_rpc(
            "execute_model", (scheduler_output,), reply_ranks=self.step_reply_ranks()
        )
        return self.step_output(replies)

    def execute_model_async(
        self, scheduler_output: SchedulerOutput
    ) -> Callable[[], ModelRunnerOutput]:
        """Start the step; return a function that waits for its output. Several steps may
        be started before the first is waited for (pipeline stages then work on different
        steps at once); their outputs are waited for in the order they started. The
        default runs the step now."""
        output = self.execute_model(scheduler_output)
        return lambda: output

    def shutdown(self) -> None:
        """Release the workers; the default has nothing to release."""
