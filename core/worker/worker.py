"""Worker: one device's share of the model — loading, KV-cache setup, executing steps."""

from __future__ import annotations

import logging

import torch
from torch import nn

from core.attention.interface import AttentionRequirements
from core.attention.layer import Attention
from core.attention.selector import select_attention_backend
from core.config import EngineConfig
from core.kv_cache.layout import KVCacheConfig, create_kv_cache_view
from core.kv_cache.spec import KVCacheSpec
from core.model_loader import Checkpoint, resolve_model
from core.models.arch_config import ArchConfig
from core.models.registry import resolve_model_class
from core.platforms.interface import Platform
from core.sample.selector import build_sampler
from core.worker.contract import ModelRunnerOutput, SchedulerOutput
from core.worker.model_runner import ModelRunner

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
        self.dtype = config.model.torch_dtype(platform.default_dtype)
        self.model: nn.Module | None = None
        self.runner: ModelRunner | None = None
        self.arch: ArchConfig | None = None

    def init_device(self) -> None:
        self.platform.set_device(self.device)
        torch.manual_seed(self.config.model.seed)

    def load_model(self, checkpoint: Checkpoint | None = None) -> None:
        """Build the model from `checkpoint` (resolved from the config by default)."""
        checkpoint = checkpoint or resolve_model(self.config.model.model)
        self.arch = ArchConfig.from_hf(checkpoint.hf_config)
        model_cls = resolve_model_class(self.arch.architectures)
        with torch.device(self.device):
            model = model_cls(self.arch, quant_config=None, dtype=self.dtype)
        model.load_weights(checkpoint.iter_weights(self.dtype))
        self.model = model.eval()
        self._bind_attention_backend(model)
        sampler = build_sampler(
            self.platform, self.config.components.sampler, self.config.components.sampler_config
        )
        scheduler = self.config.scheduler
        max_model_len = self.max_model_len
        self.runner = ModelRunner(
            model=model,
            sampler=sampler,
            device=self.device,
            max_num_reqs=scheduler.max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=scheduler.max_num_batched_tokens or max_model_len,
            vocab_size=self.arch.vocab_size,
            eos_token_id=self.arch.eos_token_id,
        )

    @property
    def max_model_len(self) -> int:
        arch = self._require(self.arch)
        return self.config.model.max_model_len or arch.max_position_embeddings

    def _bind_attention_backend(self, model: nn.Module) -> None:
        layers = self.attention_layers()
        req = AttentionRequirements(
            dtype=self.dtype,
            head_size=layers[0].head_size,
            block_size=self.config.cache.block_size,
            kv_cache_dtype=self.config.cache.kv_cache_dtype,
        )
        choice = select_attention_backend(
            self.platform, req, self.config.components.attention_backend
        )
        self.attention_backend = choice.backend
        for layer in layers:
            layer.bind_backend(choice.backend, self.config.components.attention_backend_config)

    def attention_layers(self) -> list[Attention]:
        model = self._require(self.model)
        return [m for m in model.modules() if isinstance(m, Attention)]

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        block_size = self.config.cache.block_size
        return {
            layer.layer_name: layer.kv_cache_spec(block_size, self.dtype)
            for layer in self.attention_layers()
        }

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate each KVCacheTensor and bind every layer to its view."""
        layers = {layer.layer_name: layer for layer in self.attention_layers()}
        num_blocks = kv_cache_config.num_blocks
        for tensor in kv_cache_config.kv_cache_tensors:
            buffer = torch.zeros(tensor.size, dtype=torch.int8, device=self.device)
            for name in tensor.shared_by:
                layer = layers[name]
                shape = self.attention_backend.get_kv_cache_shape(
                    num_blocks, self.config.cache.block_size, layer.num_kv_heads, layer.head_size
                )
                layer.kv_cache = create_kv_cache_view(
                    buffer, tensor, name, num_blocks, shape[1:], self.dtype
                )
        builders = [
            self.attention_backend.get_builder_cls()(
                group.kv_cache_spec, list(group.layer_names), self.device
            )
            for group in kv_cache_config.kv_cache_groups
        ]
        self._require(self.runner).initialize_kv_cache(kv_cache_config, builders)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self._require(self.runner).execute_model(scheduler_output)

    @staticmethod
    def _require(value):
        if value is None:
            raise RuntimeError("load_model must run first")
        return value
