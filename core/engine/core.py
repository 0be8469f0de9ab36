"""EngineCore: the step loop — schedule, execute, update — over one executor.

It sizes the KV cache from the workers' specs and the memory budget, then each `step()`
turns the scheduler's decision into model work and the results into EngineCoreOutputs
(token ids only; the frontend detokenizes).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from functools import partial
from typing import TYPE_CHECKING, Any

from core.config import EngineConfig
from core.engine.protocol import EngineCoreOutputs, EngineCoreRequest
from core.executor.interface import Executor
from core.executor.uniproc import UniProcExecutor
from core.kv_cache.budget import (
    check_max_model_len_fits,
    default_kv_cache_budget,
    format_bytes,
    num_blocks_for_budget,
    profiled_kv_cache_budget,
)
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.kv_cache.kv_cache_manager import KVCacheManager
from core.kv_cache.registry import load_spec_registry
from core.kv_transfer.interface import KVConnectorRole
from core.kv_transfer.selector import build_kv_connector
from core.model_loader import Checkpoint, resolve_model
from core.models.arch_config import ArchConfig
from core.platforms.interface import Platform
from core.plugins.hooks import call_each
from core.reasoning.selector import build_reasoning_parser
from core.request import Request, RequestStatus
from core.scheduler.scheduler import Scheduler
from core.spec_decode.selector import proposer_class
from core.structured_output.manager import StructuredOutputManager
from core.structured_output.reasoning_gate import IsReasoningEnd
from core.worker.contract import ModelRunnerOutput
from core.worker.sleep_mode import TAGS, check_enabled, check_sleep, wake_tags

if TYPE_CHECKING:
    from core.structured_output.xgrammar_backend import XgrammarBackend

logger = logging.getLogger(__name__)

# Dummy forwards timed at start to seed measured step budgets: a decode-sized step and a
# prefill-sized one, at most what a step holds (step_budget.StepCost fits a line through
# them until real steps come).
SEED_STEP_TOKENS = (1, 128)

# How often a step with nothing to compute polls the KV transfers it waits for (a load
# before its request can run, a send before its blocks are freed). Polling in a loop
# would take a core from the engine's own transfer threads, and on a small machine from
# the other engines.
TRANSFER_POLL_S = 0.005

# The EngineCore methods a client may call by name (EngineCoreClient.utility): maintenance
# that takes no arguments and answers nothing, so a fire-and-forget message can carry it.
UTILITIES = frozenset({"reset_prefix_cache"})


def check_utility(name: str) -> None:
    """ValueError unless `name` is one of UTILITIES."""
    if name not in UTILITIES:
        raise ValueError(f"utility {name!r} is not one of {sorted(UTILITIES)}")


# The EngineCore methods a client may call by name and wait for (EngineCoreClient.call):
# they take arguments and answer; a ValueError refusing the arguments is the caller's.
CALLS = frozenset({"sleep", "wake_up", "is_sleeping"})


def check_call(name: str) -> None:
    """ValueError unless `name` is one of CALLS."""
    if name not in CALLS:
        raise ValueError(f"call {name!r} is not one of {sorted(CALLS)}")


def _num_lookahead_tokens(config: EngineConfig) -> int:
    """KV slots past the scheduled tokens a proposer writes drafts' KV into (one per draft)."""
    spec = config.speculative
    if spec is None or not proposer_class(spec).writes_kv_cache:
        return 0
    return spec.num_speculative_tokens


def _max_steps_in_flight(config: EngineConfig) -> int:
    """One step per pipeline stage; two under async scheduling; else one."""
    if config.parallel.pipeline_parallel_size > 1:
        return config.parallel.pipeline_parallel_size
    return 2 if config.scheduler.async_scheduling else 1


def _build_executor(config: EngineConfig, platform: Platform, checkpoint: Checkpoint) -> Executor:
    """`--distributed-executor-backend`: the worker in this process, one process per rank,
    or one Ray actor per rank."""
    backend = config.parallel.distributed_executor_backend
    if backend == "mp":
        from core.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(config, platform, checkpoint)
    if backend == "ray":
        from core.executor.ray_executor import RayExecutor  # Ray is an optional extra

        return RayExecutor(config, platform, checkpoint)
    return UniProcExecutor(config, platform, checkpoint)


def _dtype_words(config: EngineConfig, platform: Platform) -> str:
    """The model's dtype and where it comes from: --dtype, or the platform's default and
    why (read only for "auto": the CPU platform may measure it)."""
    if config.model.dtype != "auto":
        return f"{config.model.dtype} (--dtype)"
    name = str(platform.default_dtype).removeprefix("torch.")
    return f"{name} ({platform.default_dtype_reason})"


def _grammar_backend(config: EngineConfig, checkpoint: Checkpoint) -> XgrammarBackend:
    """Built on the first structured-output request (xgrammar takes seconds to import)."""
    from core.structured_output.xgrammar_backend import XgrammarBackend
    from core.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(checkpoint, config.model.tokenizer)
    vocab_size = ArchConfig.from_hf(checkpoint.hf_config).vocab_size
    return XgrammarBackend(tokenizer, vocab_size)


def _reasoning_end(config: EngineConfig, checkpoint: Checkpoint) -> IsReasoningEnd | None:
    """--reasoning-parser's end-of-reasoning check, which holds grammars back until the
    reasoning ends; None without one. Built at start: a tokenizer without the parser's
    markers is an error then, not at the first structured request."""
    from core.tokenizer import load_tokenizer

    name = config.structured_outputs.reasoning_parser
    if name is None:
        return None
    tokenizer = load_tokenizer(checkpoint, config.model.tokenizer)
    return build_reasoning_parser(name, tokenizer).is_reasoning_end


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        platform: Platform,
        checkpoint: Checkpoint | None = None,
        hooks: Any = None,
    ) -> None:
        if config.model.max_model_len is None:
            raise ValueError("max_model_len must be resolved before the engine core starts")
        self.config = config
        self.hooks = hooks
        self.max_model_len = config.model.max_model_len
        logger.info("dtype: %s", _dtype_words(config, platform))
        checkpoint = checkpoint or resolve_model(config.model.model)
        self.executor = _build_executor(config, platform, checkpoint)
        self.kv = self._init_kv_cache(platform)
        self.grammars = StructuredOutputManager(
            partial(_grammar_backend, config, checkpoint),
            is_reasoning_end=_reasoning_end(config, checkpoint),
        )
        self.scheduler = Scheduler(
            config,
            self.kv,
            self.max_model_len,
            self.grammars,
            _num_lookahead_tokens(config),
            build_kv_connector(config, KVConnectorRole.SCHEDULER),
        )
        # Pipeline parallelism (one step in flight per stage) and async scheduling (the
        # next step scheduled while one runs): the steps in flight, oldest first, at most
        # `max_in_flight` (None: one step at a time).
        self.max_in_flight = _max_steps_in_flight(config)
        self.batch_queue: deque | None = deque() if self.max_in_flight > 1 else None
        # Experts spanning data-parallel engines: every step runs on all of them together.
        self.lockstep = config.parallel.experts_span_engines
        # Lock-step: the tokens every engine scheduled in the last step (0: all were idle).
        self.tokens_across_dp: int | None = None
        # Sleep mode: what of the workers is out of memory (core.worker.sleep_mode's tags).
        self.sleeping: set[str] = set()
        self._seed_step_budget()
        self._call_hook("core_engine_started")

    def _init_kv_cache(self, platform: Platform) -> KVCacheManager:
        # One spec per rank: pipeline stages hold different layers. Every rank gets as
        # many blocks as the fullest one can hold within the budget, so one block table
        # (the scheduler's) addresses all of them.
        rank_specs = self.executor.get_kv_cache_specs()
        spec_registry = load_spec_registry()
        for specs in rank_specs:
            spec_registry.validate(specs)
        cache = self.config.cache
        budget = self._kv_cache_budget(platform)
        num_blocks = min(num_blocks_for_budget(specs, budget) for specs in rank_specs)
        for specs in rank_specs:
            check_max_model_len_fits(specs, num_blocks, self.max_model_len, budget)
        configs = [kv_cache_config_for_blocks(specs, num_blocks) for specs in rank_specs]
        self.executor.initialize_kv_cache(configs)
        kv_cache_config = configs[0]
        logger.info(
            "KV cache: %s for %d blocks of %d tokens (%d tokens, %d groups)",
            format_bytes(budget),
            num_blocks - 1,
            cache.block_size,
            (num_blocks - 1) * cache.block_size,
            len(kv_cache_config.kv_cache_groups),
        )
        self.num_gpu_blocks = num_blocks
        return KVCacheManager(
            kv_cache_config,
            self.max_model_len,
            enable_caching=cache.enable_prefix_caching,
            hash_algo=cache.prefix_caching_hash_algo,
            spec_registry=spec_registry,
            watermark=cache.watermark,
        )

    def _seed_step_budget(self) -> None:
        """Time a decode-sized and a prefill-sized dummy forward (after one to warm up) as
        steps are timed, around the executor call, so a measured step budget sizes even a
        fresh server's first steps."""
        budget = self.scheduler.budget
        if not budget.measured:
            return
        start = time.perf_counter()
        max_tokens = self.config.scheduler.max_step_tokens(self.max_model_len)
        sizes = sorted({min(n, max_tokens) for n in SEED_STEP_TOKENS})
        self.executor.collective_rpc("dummy_run", (sizes[-1],))
        for num_tokens in sizes:
            step_start = time.perf_counter()
            self.executor.collective_rpc("dummy_run", (num_tokens,))
            budget.observe(num_tokens, time.perf_counter() - step_start)
        logger.info("step budgets sized from measured step times (%s), seeded in %.2f s",
                    budget.describe(), time.perf_counter() - start)  # fmt: skip

    def _kv_cache_budget(self, platform: Platform) -> int:
        """--kv-cache-memory when given; else, on a platform that profiles memory, what
        --gpu-memory-utilization leaves on the fullest rank after a profiled forward of
        the largest batch; else the platform's default share of available memory."""
        cache = self.config.cache
        if cache.kv_cache_memory_bytes is not None:
            return cache.kv_cache_memory_bytes
        if platform.memory_profiling:
            profiles = self.executor.profile_memory()
            return profiled_kv_cache_budget(profiles, cache.gpu_memory_utilization)
        return default_kv_cache_budget(platform)

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request; ValueError (nothing queued) when it cannot be served."""
        self.scheduler.add_request(
            Request.from_engine_core_request(request, self.kv.block_hasher, self.max_model_len)
        )

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> EngineCoreOutputs:
        """Advance every unfinished request by one step: schedule, execute, update.

        Call it in a loop from one thread while `has_unfinished_requests()`; with none it
        returns empty outputs at once, except in lock-step (`lockstep`): then it joins the
        other engines' step (a placeholder forward while any has tokens), and
        `tokens_across_dp` tells whether any had. The outputs carry, per request that
        produced any, its new token ids (or its pooled vector), logprobs, and its finish
        reason once it is done; a finished request's resources are freed before this
        returns. Under
        pipeline parallelism a call may only start a step and return empty outputs; the
        step's tokens come with a later call. Token ids only: the frontend detokenizes.
        """
        if self.sleeping or not self.scheduler.has_unfinished_requests() and not self.lockstep:
            return EngineCoreOutputs()
        if self.batch_queue is not None:
            return self._step_with_batch_queue(self.batch_queue)
        scheduler_output = self.scheduler.schedule()
        idle = scheduler_output.total_num_scheduled_tokens == 0
        # Nothing to compute: grammars still compiling (wait for one) or KV transfers
        # under way (the step starts and reports them; poll again a little later).
        waited = idle and self.grammars.wait(0.05)
        start = time.perf_counter()
        runner_output = self.executor.execute_model(scheduler_output)
        self.scheduler.observe_step(scheduler_output, time.perf_counter() - start)
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        self.tokens_across_dp = runner_output.num_tokens_across_dp
        # In lock-step the other engines' steps pace this one while they have tokens.
        if idle and not waited and not outputs.outputs and not self.tokens_across_dp:
            time.sleep(TRANSFER_POLL_S)
        return outputs

    def _step_with_batch_queue(self, queue: deque) -> EngineCoreOutputs:
        """Keep up to `max_in_flight` steps in flight. Schedule and start a step while there
        is room and work; otherwise (or once the queue is full) wait for the oldest step
        and turn its output into EngineCoreOutputs.

        Under pipeline parallelism (one step per stage) a request runs in one in-flight step
        at a time: once its known tokens are all scheduled, it waits for the token its step
        will sample. Under async scheduling (two steps: one runs while the next is
        scheduled) the scheduler lets a step compute a token the running step will sample
        (its placeholders), so the workers never wait for the scheduler."""
        if len(queue) < self.max_in_flight:
            scheduler_output = self.scheduler.schedule()
            # A step with no tokens still tells the workers which requests finished.
            if scheduler_output.total_num_scheduled_tokens or scheduler_output.finished_req_ids:
                queue.append(
                    (scheduler_output, self.executor.execute_model_async(scheduler_output))
                )
                if len(queue) < self.max_in_flight:
                    return EngineCoreOutputs()
            elif not queue:
                self.grammars.wait(0.05)  # only grammars still compiling
                return self.scheduler.update_from_output(
                    scheduler_output, ModelRunnerOutput(req_ids=[], sampled_token_ids=[])
                )
        scheduler_output, wait = queue.popleft()
        runner_output = wait()
        if self.config.scheduler.async_scheduling:  # pipeline stages' times overlap
            self.scheduler.observe_step(scheduler_output, runner_output.execute_seconds)
        return self.scheduler.update_from_output(scheduler_output, runner_output)

    def reset_prefix_cache(self) -> bool:
        return self.kv.reset_prefix_cache()

    def call_utility(self, name: str) -> None:
        """Run the maintenance call `name` (one of UTILITIES), as a client asks by name."""
        check_utility(name)
        getattr(self, name)()

    def call(self, name: str, *args: Any) -> Any:
        """Run the call `name` (one of CALLS) with `args`, as a client asks by name; its
        answer."""
        check_call(name)
        return getattr(self, name)(*args)

    # -- sleep mode (--enable-sleep-mode; the workers' side: core.worker.sleep_mode) ---------

    def sleep(self, level: int = 1) -> None:
        """Abort every request (vLLM's default "abort" mode), wait for the steps in flight,
        forget the prefix cache, and have every worker free its KV cache and offload
        (level 1) or drop (level 2) its weights. Until `wake_up` brings all of it back,
        steps run nothing and new requests wait. ValueError (nothing sleeps) without
        --enable-sleep-mode, for another level, or for a level 2 that would lose state."""
        check_sleep(self.config, level)
        self.abort_requests(list(self.scheduler.requests))
        while self.batch_queue:  # their requests are gone: their outputs go nowhere
            scheduler_output, wait = self.batch_queue.popleft()
            self.scheduler.update_from_output(scheduler_output, wait())
        if not self.reset_prefix_cache():
            raise ValueError("sleep: KV transfers still hold cache blocks; try again later")
        self.executor.collective_rpc("sleep", (level,))
        self.sleeping = set(TAGS)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back `tags` of what `sleep` freed ("weights", "kv_cache"; None: both);
        requests run again once nothing sleeps. ValueError without --enable-sleep-mode or
        for another tag."""
        check_enabled(self.config)
        woken = wake_tags(tags)
        self.executor.collective_rpc("wake_up", (list(woken),))
        self.sleeping -= set(woken)

    def is_sleeping(self) -> bool:
        return bool(self.sleeping)

    def shutdown(self) -> None:
        self.grammars.shutdown()
        self.executor.shutdown()
        self._call_hook("core_engine_stopped")

    def _call_hook(self, name: str) -> None:
        if self.hooks is not None:
            call_each(self.hooks, name, config=self.config)
