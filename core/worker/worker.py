"""Worker: one device's share of the model — loading, KV-cache setup, executing steps."""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from core.attention.interface import AttentionRequirements, BuilderLimits, GraphSupport
from core.attention.layer import Attention, prefix_layer_names
from core.attention.selector import select_attention_backend
from core.compilation.compiler import compile_model
from core.config import CUDAGraphMode, EngineConfig
from core.kv_cache.budget import MemoryProfile, format_bytes
from core.kv_cache.layout import KVCacheConfig, create_kv_cache_view
from core.kv_cache.spec import KVCacheSpec
from core.lora.interface import LoRAManager
from core.lora.selector import lora_manager_class
from core.model_loader import Checkpoint, resolve_model
from core.models.arch_config import ArchConfig
from core.models.registry import build_model
from core.platforms.interface import Platform
from core.pooling.pooler import build_pooler
from core.quantization.interface import QuantizationConfig
from core.quantization.selector import build_quantization_config, resolve_quantization
from core.sample.interface import Sampler
from core.sample.selector import build_sampler
from core.spec_decode.interface import ProposerContext
from core.spec_decode.rejection_sampler import StandardRejectionSampler
from core.spec_decode.selector import proposer_class
from core.worker.contract import ModelRunnerOutput, SchedulerOutput
from core.worker.model_runner import ModelRunner
from core.worker.speculator import Speculator

logger = logging.getLogger(__name__)


class Worker:
    """Runs in the engine-core process (uniproc) or in its own process (one per rank)."""

    def __init__(
        self, config: EngineConfig, platform: Platform, rank: int = 0, local_rank: int = 0
    ) -> None:
        self.config = config
        self.platform = platform
        self.rank = rank
        self.device = platform.torch_device(local_rank)
        self.dtype = config.model.torch_dtype(platform)
        self.model: nn.Module | None = None
        self.speculator: Speculator | None = None
        self.runner: ModelRunner | None = None
        self.arch: ArchConfig | None = None
        self.graph_mode = CUDAGraphMode.NONE  # -O2's graphs, resolved in load_model
        self.free_memory_at_start: int | None = None

    def init_device(self) -> None:
        """Take the device; on a profiling platform, note what is free on it before this
        worker loads anything (profile_memory compares the budget with it)."""
        self.platform.set_device(self.device)
        if self.platform.memory_profiling:
            self.free_memory_at_start = self.platform.memory_info().available_bytes
        torch.manual_seed(self.config.model.seed)

    def load_model(self, checkpoint: Checkpoint | None = None) -> None:
        """Build the model from `checkpoint` (resolved from the config by default), and the
        speculative proposer when one is configured."""
        checkpoint = checkpoint or resolve_model(self.config.model.model)
        self.model, self.arch = self._build_model(checkpoint)
        self.lora = self._build_lora_manager(self.model)
        sampler = build_sampler(
            self.platform, self.config.components.sampler, self.config.components.sampler_config
        )
        self.speculator = self._build_speculator(sampler)
        self._bind_attention_backend()
        # Resolved once, with the backend: the compile needs it (pieces or not) and so
        # does the capture after the KV cache exists.
        self.graph_mode = self._graph_mode()
        scheduler = self.config.scheduler
        max_model_len = self.max_model_len
        self.runner = ModelRunner(
            model=self.model,
            sampler=sampler,
            device=self.device,
            max_num_reqs=scheduler.max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=scheduler.max_step_tokens(max_model_len),
            vocab_size=self.arch.vocab_size,
            eos_token_id=self.arch.eos_token_id,
            speculator=self.speculator,
            lora=self.lora,
            pin_memory=self.platform.pin_memory,
            pooler=None if self.config.pooler is None else build_pooler(self.config.pooler),
        )
        if self.config.compilation.compile_model:
            self._compile_model(self.runner)

    def _compile_model(self, runner: ModelRunner) -> None:
        """-O1: compile the target's forward and trace it now, with dummy batches of the
        largest and the smallest step, so no request waits for a compile."""
        pieces = self.graph_mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE)
        capture = self.platform.capture_graph if pieces else None
        model = self._require(self.model)
        runner.use_compiled(compile_model(model, self.config.compilation, capture))
        start = time.perf_counter()
        for num_tokens in sorted({runner.max_num_tokens, 1}, reverse=True):
            runner.dummy_run(num_tokens)
        logger.info("compiled the model in %.1f s", time.perf_counter() - start)

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

    def _build_lora_manager(self, model: nn.Module) -> LoRAManager | None:
        """With --enable-lora, the implementation that wraps the loaded model's layers."""
        config = self.config.lora
        if config is None:
            return None
        return lora_manager_class(config)(model, config, self.device, self.dtype)

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

    def _build_speculator(self, sampler: Sampler) -> Speculator | None:
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
            target_model=self._require(self.model),
            target_arch=self._require(self.arch),
            device=self.device,
            dtype=self.dtype,
            load_model=lambda path, prefix: self._build_model(resolve_model(path), prefix),
        )
        # Its options were checked in the frontend; the proposer's __init__ reads them.
        proposer = proposer_class(spec)(spec, context)
        return Speculator(proposer, StandardRejectionSampler(), spec.num_speculative_tokens)

    @property
    def max_model_len(self) -> int:
        arch = self._require(self.arch)
        return self.config.model.max_model_len or arch.max_position_embeddings

    def _bind_attention_backend(self) -> None:
        layers = self.attention_layers()
        req = AttentionRequirements(
            dtype=self.dtype,
            head_size=layers[0].head_size,
            block_size=self.config.cache.block_size,
            kv_cache_dtype=self.config.cache.kv_cache_dtype,
            attn_type=layers[0].attn_type,
        )
        choice = select_attention_backend(
            self.platform, req, self.config.components.attention_backend
        )
        self.attention_backend = choice.backend
        for layer in layers:
            layer.bind_backend(choice.backend, self.config.components.attention_backend_config)

    def attention_layers(self) -> list[Attention]:
        """The target's attention layers, then those of the proposer's draft, if any."""
        model = self._require(self.model)
        layers = [m for m in model.modules() if isinstance(m, Attention)]
        if self.speculator is not None:
            layers += self.speculator.proposer.attention_layers()
        return layers

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        block_size = self.config.cache.block_size
        specs = {
            m.layer_name: m.kv_cache_spec(block_size, self.dtype)
            for m in self._require(self.model).modules()
            if isinstance(m, Attention)
        }
        if self.speculator is not None:
            specs |= self.speculator.proposer.kv_cache_spec(block_size, self.dtype)
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
        runner = self._require(self.runner)
        self.platform.reset_peak_memory()
        runner.dummy_run(runner.max_num_tokens)
        peak = self.platform.peak_memory_bytes()
        total = self.platform.memory_info().total_bytes
        logger.info(
            "rank %d: peak %s of %s device memory without the KV cache (%d-token forward)",
            self.rank, format_bytes(peak), format_bytes(total), runner.max_num_tokens,
        )  # fmt: skip
        return MemoryProfile(total, self.free_memory_at_start, peak)

    def initialize_kv_cache_of_rank(self, kv_cache_configs: list[KVCacheConfig]) -> None:
        """`initialize_kv_cache` with this rank's entry of a list indexed by global rank."""
        self.initialize_kv_cache(kv_cache_configs[self.rank])

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate each KVCacheTensor and bind every layer to its view."""
        layers = {layer.layer_name: layer for layer in self.attention_layers()}
        num_blocks = kv_cache_config.num_blocks
        for tensor in kv_cache_config.kv_cache_tensors:
            buffer = self.platform.zeroed_bytes(tensor.size, self.device)
            for name in tensor.shared_by:
                layer = layers[name]
                shape = self.attention_backend.get_kv_cache_shape(
                    num_blocks, self.config.cache.block_size, layer.num_kv_heads, layer.head_size
                )
                layer.kv_cache = create_kv_cache_view(
                    buffer, tensor, name, num_blocks, shape[1:], self.dtype
                )
        runner = self._require(self.runner)
        limits = BuilderLimits(runner.max_num_reqs, runner.max_num_tokens, runner.max_model_len)
        builders = []
        for group in kv_cache_config.kv_cache_groups:
            builder = self.attention_backend.get_builder_cls()(
                group.kv_cache_spec, list(group.layer_names), self.device
            )
            builder.reserve(limits)
            builders.append(builder)
        runner.initialize_kv_cache(kv_cache_config, builders)
        if self.graph_mode is not CUDAGraphMode.NONE:
            sizes = self.config.compilation.cudagraph_capture_sizes
            runner.capture_graphs(self.graph_mode, self.platform.capture_graph, sizes)

    def _graph_mode(self) -> CUDAGraphMode:
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
        backend = self.attention_backend
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

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self._require(self.runner).execute_model(scheduler_output)

    @staticmethod
    def _require(value):
        if value is None:
            raise RuntimeError("load_model must run first")
        return value
