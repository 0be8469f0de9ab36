"""Worker: one device's share of the model — loading, KV-cache setup, executing steps."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from torch import nn

from core import batch_invariant
from core.attention.interface import (
    AttentionBackend,
    AttentionMetadataBuilder,
    AttentionRequirements,
    BuilderLimits,
    GraphSupport,
)
from core.attention.kv_cache_dtype import kv_cache_torch_dtype
from core.attention.layer import Attention, prefix_layer_names
from core.attention.selector import select_attention_backend
from core.compilation.compiler import compile_model
from core.config import CUDAGraphMode, EngineConfig
from core.distributed.eplb import EplbState
from core.distributed.parallel_state import get_dp_group, get_ep_group
from core.kernel_choice import KERNEL_CHOICES
from core.kv_cache.budget import MemoryProfile, format_bytes
from core.kv_cache.layout import KVCacheConfig, create_kv_cache_view
from core.kv_cache.spec import KVCacheSpec
from core.kv_transfer.interface import KVConnectorRole
from core.kv_transfer.selector import build_kv_connector
from core.lora.interface import LoRAManager
from core.lora.selector import lora_manager_class
from core.model_loader import Checkpoint, resolve_model
from core.models import iter_attention_layers
from core.models.arch_config import ArchConfig
from core.models.layers.fused_moe import FusedMoE
from core.models.registry import build_model
from core.platforms.interface import Platform
from core.pooling.pooler import build_pooler
from core.quantization.interface import QuantizationConfig
from core.quantization.selector import build_quantization_config, resolve_quantization
from core.sample.interface import Sampler
from core.sample.logits_processor_selector import build_logits_processors
from core.sample.selector import build_sampler
from core.spec_decode.interface import ProposerContext
from core.spec_decode.rejection_sampler import StandardRejectionSampler
from core.spec_decode.selector import proposer_class
from core.worker.contract import ModelRunnerOutput, SchedulerOutput
from core.worker.model_runner import ModelRunner
from core.worker.sleep_mode import WorkerSleep
from core.worker.speculator import Speculator

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """What `Worker.load_model` built: all that the KV-cache setup and the steps use."""

    model: nn.Module
    lora: LoRAManager | None  # --enable-lora's manager, wrapping the model's layers
    speculator: Speculator | None  # --speculative-config's proposer and rejection sampler
    # The target's attention layers, then the draft's: found once, bound to the backend
    # here, reported by get_kv_cache_spec and given their views by initialize_kv_cache.
    attention_layers: tuple[Attention, ...]
    attention_backend: type[AttentionBackend]
    # -O2's graphs: resolved with the backend, since the compile needs it (pieces or
    # not) and so does the capture once the KV cache exists.
    graph_mode: CUDAGraphMode
    runner: ModelRunner


class Worker:
    """One rank: its share of the model, its KV cache, and its part of every step.

    It lives in the engine-core process (UniProcExecutor) or in a process of its own per
    rank (multiproc's worker_proc, Ray's actors); executors call its methods by name
    (`Executor.collective_rpc`), on every rank at once. Start-up runs in this order, each
    phase using what the one before produced:

    1. `init_device()`: take the device (and, on a memory-profiling platform, note what is
       free on it before anything is loaded; `profile_memory` needs that).
    2. `load_model(checkpoint)`: build the model, the LoRA manager, the sampler and the
       speculator (its draft model, if any); find the attention layers once; bind them
       to the selected attention backend; resolve the graph mode; build the ModelRunner;
       with -O1, compile and warm it up. What it built is `loaded`.
    3. `get_kv_cache_spec()` and, on profiling platforms, `profile_memory()`: what the
       engine sizes the KV cache with.
    4. `initialize_kv_cache(config)` (`initialize_kv_cache_of_rank` from executors):
       allocate the cache, give each attention layer its view, build the attention
       metadata builders, capture -O2's graphs.
    5. `execute_model(scheduler_output)`, once per step.

    Steps 3-5 before `load_model` raise RuntimeError; so does a step before step 4.
    """

    def __init__(
        self, config: EngineConfig, platform: Platform, rank: int = 0, local_rank: int = 0
    ) -> None:
        self.config = config
        self.platform = platform
        self.rank = rank
        self.device = platform.torch_device(local_rank)
        self.dtype = config.model.torch_dtype(platform)
        # What the KV cache holds: the model's dtype, or an FP8 one (--kv-cache-dtype).
        self.kv_cache_dtype = kv_cache_torch_dtype(config.cache.kv_cache_dtype, self.dtype)
        # Set by init_device on a memory-profiling platform.
        self.free_memory_at_start: int | None = None
        self._loaded: LoadedModel | None = None  # set by load_model
        self._sleep: WorkerSleep | None = None  # set by load_model (--enable-sleep-mode)

    @property
    def loaded(self) -> LoadedModel:
        """What load_model built; RuntimeError before it ran."""
        if self._loaded is None:
            raise RuntimeError("load_model must run first")
        return self._loaded

    @property
    def model(self) -> nn.Module:
        return self.loaded.model

    @property
    def lora(self) -> LoRAManager | None:
        return self.loaded.lora

    @property
    def runner(self) -> ModelRunner:
        return self.loaded.runner

    # -- 1. device ------------------------------------------------------------------------

    def init_device(self) -> None:
        """Take the device; on a profiling platform, note what is free on it before this
        worker loads anything (profile_memory compares the budget with it)."""
        self.platform.set_device(self.device)
        if self.platform.memory_profiling:
            self.free_memory_at_start = self.platform.memory_info().available_bytes
        torch.manual_seed(self.config.model.seed)
        # Before any kernel is chosen or run: the ops read the mode at each call.
        batch_invariant.set_enabled(self.config.model.batch_invariant)

    # -- 2. model -------------------------------------------------------------------------

    def load_model(self, checkpoint: Checkpoint | None = None) -> None:
        """Build the model from `checkpoint` (resolved from the config by default), and all
        that runs it (the phases of the class docstring's step 2, in order)."""
        checkpoint = checkpoint or resolve_model(self.config.model.model)
        model, arch = self._build_model(checkpoint)
        lora = self._build_lora_manager(model)
        components = self.config.components
        sampler = build_sampler(self.platform, components.sampler, components.sampler_config)
        speculator = self._build_speculator(sampler, model, arch)
        layers = _find_attention_layers(model, speculator)
        backend = self._bind_attention_backend(layers)
        graph_mode = self._graph_mode(backend)
        runner = self._build_runner(model, arch, sampler, speculator, lora)
        self._choose_kernels(runner)
        if self.config.compilation.compile_model:
            self._compile_model(runner, model, graph_mode)
        if self.config.parallel.enable_eplb:
            experts = [m for m in model.modules() if isinstance(m, FusedMoE)]
            runner.use_eplb(EplbState(experts, self.config.parallel.eplb, get_ep_group()))
        if self.config.parallel.experts_span_engines:
            runner.step_in_lockstep(get_dp_group())
        self._loaded = LoadedModel(model, lora, speculator, layers, backend, graph_mode, runner)
        self._sleep = WorkerSleep(
            model,
            lambda: [layer.kv_cache for layer in layers],
            lambda: self._build_model(checkpoint)[0],
            self.device,
            self.platform.pin_memory,
        )

    def _build_model(
        self, checkpoint: Checkpoint, prefix: str = ""
    ) -> tuple[nn.Module, ArchConfig]:
        """A model with its weights, on this worker's device and dtype; a `prefix` renames
        its attention layers (a second model beside the target)."""
        quant_config = self._quantization_config(checkpoint, draft=bool(prefix))
        model = build_model(checkpoint, quant_config, self.dtype, self.device)
        if prefix:
            prefix_layer_names(model, prefix)
        return model, ArchConfig.from_hf(checkpoint.hf_config)

    def _quantization_config(
        self, checkpoint: Checkpoint, draft: bool
    ) -> QuantizationConfig | None:
        """The target runs with the method the frontend resolved; a draft checkpoint beside
        it runs with the same method when it is stored in it, else as its storage implies
        (a float draft of a GGUF-native target stays float)."""
        stored = checkpoint.stored_quantization
        requested = self.config.model.quantization
        if draft and requested != stored.method:
            requested = None
        method = resolve_quantization(requested, stored)
        return None if method is None else build_quantization_config(method, checkpoint.hf_config)

    def _build_lora_manager(self, model: nn.Module) -> LoRAManager | None:
        """With --enable-lora, the implementation that wraps the loaded model's layers."""
        config = self.config.lora
        if config is None:
            return None
        return lora_manager_class(config)(model, config, self.device, self.dtype)

    def _build_speculator(
        self, sampler: Sampler, model: nn.Module, arch: ArchConfig
    ) -> Speculator | None:
        """With --speculative-config, the proposer (its draft model loaded beside `model`)
        and the rejection sampler, which needs `sampler`'s process_logits."""
        spec = self.config.speculative
        if spec is None:
            return None
        if type(sampler).process_logits is Sampler.process_logits:
            raise ValueError(
                f"speculative_config: sampler {type(sampler).__name__} cannot verify drafts "
                "(it does not implement process_logits); use the default sampler"
            )
        context = ProposerContext(
            engine_config=self.config,
            target_model=model,
            target_arch=arch,
            device=self.device,
            dtype=self.dtype,
            load_model=lambda path, prefix: self._build_model(resolve_model(path), prefix),
        )
        # Its options were checked in the frontend; the proposer's __init__ reads them.
        proposer = proposer_class(spec)(spec, context)
        return Speculator(proposer, StandardRejectionSampler(), spec.num_speculative_tokens)

    def _bind_attention_backend(self, layers: tuple[Attention, ...]) -> type[AttentionBackend]:
        """Select the backend for the first layer's needs and bind every layer to it."""
        components = self.config.components
        cache = self.config.cache
        req = AttentionRequirements(
            dtype=self.dtype,
            head_size=layers[0].head_size,
            block_size=cache.block_size,
            kv_cache_dtype=cache.kv_cache_dtype,
            attn_type=layers[0].attn_type,
            use_mla=layers[0].use_mla,
            logits_soft_cap=any(layer.logits_soft_cap is not None for layer in layers),
            batch_invariant=self.config.model.batch_invariant,
        )
        choice = select_attention_backend(self.platform, req, components.attention_backend)
        for layer in layers:
            layer.bind_backend(
                choice.backend, components.attention_backend_config, cache.kv_cache_dtype
            )
        return choice.backend

    def _graph_mode(self, backend: type[AttentionBackend]) -> CUDAGraphMode:
        """The cudagraph mode this worker captures (-O2), given its attention backend.

        Unset, it is vLLM's default: FULL graphs for pure decodes where the backend can be
        captured whole, PIECEWISE for the rest when the model is compiled. A FULL mode the
        backend cannot serve is refused; so are graphs the user asked for (-O2, a mode)
        that nothing can give. Graphs that only came from the platform's default level
        are dropped with a log line instead.
        """
        compilation = self.config.compilation
        if not compilation.capture_graphs:
            return CUDAGraphMode.NONE
        whole = backend.graph_support is not GraphSupport.NEVER
        mode = compilation.cudagraph_mode
        if mode is None:
            pieces = compilation.compile_model
            mode = {
                (True, True): CUDAGraphMode.FULL_AND_PIECEWISE,
                (True, False): CUDAGraphMode.FULL_DECODE_ONLY,
                (False, True): CUDAGraphMode.PIECEWISE,
                (False, False): CUDAGraphMode.NONE,
            }[whole, pieces]
        if mode in (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE) and not whole:
            raise ValueError(
                f"compilation_config.cudagraph_mode {mode.value} captures attention in the "
                f"graph, which attention backend {backend.name!r} does not support (no "
                "graph_support): use PIECEWISE or --attention-backend flash"
            )
        if mode is CUDAGraphMode.NONE:
            asked = ("level", "capture_graphs")
            if any(compilation.is_user_set(key) for key in asked):
                raise ValueError(
                    f"-O{compilation.level} captures graphs, but attention backend "
                    f"{backend.name!r} cannot be captured and the model is not compiled "
                    "(no pieces to capture): use -O1 or --enforce-eager"
                )
            logger.info("no graph capture: nothing to capture with %s uncompiled", backend.name)
        return mode

    def _build_runner(
        self,
        model: nn.Module,
        arch: ArchConfig,
        sampler: Sampler,
        speculator: Speculator | None,
        lora: LoRAManager | None,
    ) -> ModelRunner:
        """The runner of this rank's steps, sized by the scheduler's limits and the context."""
        scheduler = self.config.scheduler
        max_model_len = self.config.model.max_model_len or arch.max_position_embeddings
        return ModelRunner(
            model=model,
            sampler=sampler,
            device=self.device,
            max_num_reqs=scheduler.max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=scheduler.max_step_tokens(max_model_len),
            vocab_size=arch.vocab_size,
            eos_token_id=arch.eos_token_id,
            speculator=speculator,
            lora=lora,
            pin_memory=self.platform.pin_memory,
            pooler=None if self.config.pooler is None else build_pooler(self.config.pooler, model),
            logits_processors=build_logits_processors(
                self.config, self.device, self.platform.pin_memory
            ),
        )

    def _choose_kernels(self, runner: ModelRunner) -> None:
        """Where kernel packages registered several kernels for an op, time them on the
        model's own weights and keep the fastest per weight shape and row bucket
        (core.kernel_choice): a one-token dummy forward names the problems, then each is
        measured, or read from the cache of an earlier start on this CPU. The model's
        weights' bytes set the read a decode step's calls are held to."""
        if not KERNEL_CHOICES.candidates:
            return  # no kernel package offers a choice: no dummy forward to pay for
        with KERNEL_CHOICES.recording() as recorded:
            runner.dummy_run(1)
        if not recorded:
            return
        start = time.perf_counter()
        choices = KERNEL_CHOICES.measure(
            recorded, runner.max_num_tokens, weight_bytes=_tensor_bytes(runner.model)
        )
        logger.info(
            "kernel choices for %d weight shapes in %.2f s (`core info` lists them)",
            len(choices), time.perf_counter() - start,
        )  # fmt: skip

    def _compile_model(
        self, runner: ModelRunner, model: nn.Module, graph_mode: CUDAGraphMode
    ) -> None:
        """-O1: compile the target's forward and trace it now, with dummy batches of the
        largest and the smallest step, so no request waits for a compile."""
        pieces = graph_mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE)
        capture = self.platform.capture_graph if pieces else None
        runner.use_compiled(compile_model(model, self.config.compilation, capture))
        start = time.perf_counter()
        for num_tokens in sorted({runner.max_num_tokens, 1}, reverse=True):
            runner.dummy_run(num_tokens)
        logger.info("compiled the model in %.1f s", time.perf_counter() - start)

    # -- 3. sizing the KV cache -----------------------------------------------------------

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """Each attention layer's spec by layer name, the target's then the draft's; the
        proposer gives its draft's (it may keep them in a group of their own)."""
        loaded = self.loaded
        block_size = self.config.cache.block_size
        specs = {
            layer.layer_name: layer.kv_cache_spec(block_size, self.kv_cache_dtype)
            for layer in loaded.attention_layers
        }
        if loaded.speculator is not None:
            specs |= loaded.speculator.proposer.kv_cache_spec(block_size, self.kv_cache_dtype)
        return specs

    def profile_memory(self) -> MemoryProfile:
        """Measure the device memory a step needs without the KV cache: a forward of the
        largest batch (the runner's max_num_tokens) between a reset and a read of the
        platform's peak counter. Runs on every rank at once (the forward's collectives),
        before initialize_kv_cache; needs a memory_profiling platform."""
        if self.free_memory_at_start is None:
            raise RuntimeError(
                f"profile_memory: the {self.platform.name} platform does not profile memory"
            )
        runner = self.runner
        self.platform.reset_peak_memory()
        runner.dummy_run(runner.max_num_tokens)
        peak = self.platform.peak_memory_bytes()
        total = self.platform.memory_info().total_bytes
        logger.info(
            "rank %d: peak %s of %s device memory without the KV cache (%d-token forward)",
            self.rank, format_bytes(peak), format_bytes(total), runner.max_num_tokens,
        )  # fmt: skip
        return MemoryProfile(total, self.free_memory_at_start, peak)

    # -- 4. the KV cache ------------------------------------------------------------------

    def initialize_kv_cache_of_rank(self, kv_cache_configs: list[KVCacheConfig]) -> None:
        """`initialize_kv_cache` with this rank's entry of a list indexed by global rank."""
        self.initialize_kv_cache(kv_cache_configs[self.rank])

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate the cache and bind every layer to its view, give the runner the
        metadata builders and --kv-transfer-config's connector (its worker role, given
        every layer's view), then capture -O2's graphs (they need all of it)."""
        loaded = self.loaded
        self._allocate_kv_cache(kv_cache_config, loaded.attention_layers, loaded.attention_backend)
        builders = self._build_metadata_builders(
            kv_cache_config, loaded.attention_backend, loaded.runner
        )
        loaded.runner.initialize_kv_cache(kv_cache_config, builders)
        connector = build_kv_connector(self.config, KVConnectorRole.WORKER)
        if connector is not None:
            connector.rank = self.rank
            connector.register_kv_caches(
                {layer.layer_name: layer.kv_cache for layer in loaded.attention_layers}
            )
            loaded.runner.use_kv_connector(connector)
        if loaded.graph_mode is not CUDAGraphMode.NONE:
            sizes = self.config.compilation.cudagraph_capture_sizes
            loaded.runner.capture_graphs(loaded.graph_mode, self.platform.capture_graph, sizes)

    def _allocate_kv_cache(
        self,
        kv_cache_config: KVCacheConfig,
        layers: tuple[Attention, ...],
        backend: type[AttentionBackend],
    ) -> None:
        """Allocate each KVCacheTensor and give every layer sharing it its view."""
        by_name = {layer.layer_name: layer for layer in layers}
        num_blocks = kv_cache_config.num_blocks
        block_size = self.config.cache.block_size
        for tensor in kv_cache_config.kv_cache_tensors:
            buffer = self.platform.zeroed_bytes(tensor.size, self.device)
            for name in tensor.shared_by:
                layer = by_name[name]
                shape = backend.get_kv_cache_shape(
                    num_blocks, block_size, layer.num_kv_heads, layer.head_size
                )
                layer.kv_cache = create_kv_cache_view(
                    buffer, tensor, name, num_blocks, shape[1:], self.kv_cache_dtype
                )

    def _build_metadata_builders(
        self,
        kv_cache_config: KVCacheConfig,
        backend: type[AttentionBackend],
        runner: ModelRunner,
    ) -> list[AttentionMetadataBuilder]:
        """One builder per KV-cache group, its buffers reserved for the runner's limits."""
        limits = BuilderLimits(runner.max_num_reqs, runner.max_num_tokens, runner.max_model_len)
        builders = []
        for group in kv_cache_config.kv_cache_groups:
            builder = backend.get_builder_cls()(
                group.kv_cache_spec, list(group.layer_names), self.device
            )
            builder.reserve(limits)
            builders.append(builder)
        return builders

    # -- 5. steps -------------------------------------------------------------------------

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step on this rank: apply `scheduler_output`'s changes to the persistent
        batch, forward the scheduled tokens and sample. Called in the worker's process on
        every rank at once, after initialize_kv_cache (RuntimeError before it, or before
        load_model). Returns the sampled tokens (and drafts, logprobs, pooled outputs); a
        pipeline stage before the last returns no tokens, only the batch's request ids."""
        start = time.perf_counter()
        output = self.runner.execute_model(scheduler_output)
        output.execute_seconds = time.perf_counter() - start
        return output

    def eplb_imbalance(self) -> tuple[list[float], float]:
        """--enable-eplb's measured expert imbalance (most tokens on a rank over the mean):
        (that of the window each rearrangement balanced, that of the current window);
        RuntimeError without EPLB."""
        eplb = self.loaded.runner.eplb
        if eplb is None:
            raise RuntimeError("EPLB is off: start the engine with --enable-eplb")
        return list(eplb.history), eplb.imbalance()

    def shutdown(self) -> None:
        """Release what outlives a step outside this process's memory (the KV connector's
        sockets and threads) when the engine stops; the process may go on."""
        connector = None if self._loaded is None else self._loaded.runner.kv_connector
        if connector is not None:
            connector.shutdown()

    def sleep(self, level: int) -> int:
        """--enable-sleep-mode (core.worker.sleep_mode): free the KV cache and offload
        (level 1) or drop (level 2) the weights until `wake_up`; the bytes freed. No step
        may run in between. RuntimeError before load_model."""
        if self._sleep is None:
            raise RuntimeError("load_model must run first")
        return self._sleep.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back `tags` of what `sleep` freed ("weights", "kv_cache"; None: both)."""
        if self._sleep is None:
            raise RuntimeError("load_model must run first")
        self._sleep.wake_up(tags)

    def dummy_run(self, num_tokens: int) -> None:
        """A forward of `num_tokens` placeholder tokens (ModelRunner.dummy_run) on every rank
        at once: the engine core times a few to size its first steps (step_budget.py)."""
        self.runner.dummy_run(num_tokens)


def _find_attention_layers(
    model: nn.Module, speculator: Speculator | None
) -> tuple[Attention, ...]:
    """The one walk for attention layers: the target's, then the proposer's draft's."""
    layers = list(iter_attention_layers(model))
    if speculator is not None:
        layers += speculator.proposer.attention_layers()
    return tuple(layers)


def _tensor_bytes(model: nn.Module) -> int:
    """What the model's parameters and buffers take (each tensor once)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.nbytes for t in tensors.values())
