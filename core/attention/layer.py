"""The Attention layer models use: q/k/v in, attention out, backend chosen elsewhere.

A model creates one `Attention` per attention layer with its unique `layer_name` (the
module prefix, e.g. "model.layers.0.self_attn.attn"). The model runner later binds the
selected backend (`bind_backend`) and the layer's KV-cache view (`kv_cache`); at forward
time the layer reads its metadata from the forward context. No model code knows which
backend runs.

Under torch.compile the layer calls the `core::unified_attention` op instead of its
kernel: the op is opaque to Dynamo (it writes into an output the graph allocates), so the
backend's Python, metadata and KV-cache writes stay out of the graph and the compiled
pieces between attention layers are plain tensor code. The op finds the layer by name in
the forward context.

A forward whose context has no metadata entry for the layer (a dummy run: profiling memory
or warming up compilation, before the KV cache exists) outputs zeros.

An FP8 KV cache (--kv-cache-dtype) stores K/V divided by the layer's `kv_scales`, which
the model's weight loading fills from the checkpoint where it has them
(`load_kv_scale`) and which are 1.0 otherwise (core.attention.kv_cache_dtype says why).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn

from core.attention.interface import AttentionBackend, AttentionImpl, AttentionType
from core.attention.kv_cache_dtype import KVCacheScales, kv_scale_target
from core.forward_context import get_forward_context
from core.kv_cache.spec import AttentionSpec, FullAttentionSpec, SlidingWindowSpec
from core.ops.registry import CORE_OPS
from core.plugins.components import build_component


class Attention(nn.Module):
    # Multi-head latent attention (core.attention.mla.MLAAttention): its requirements and
    # KV-cache spec differ, and only an MLA backend serves it.
    use_mla: ClassVar[bool] = False

    def __init__(
        self,
        layer_name: str,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        attn_type: AttentionType = AttentionType.DECODER,
        logits_soft_cap: float | None = None,
    ) -> None:
        """`logits_soft_cap` c turns each score s into c * tanh(s / c) before the softmax
        (Gemma 2); only a backend that declares the capability can serve it."""
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"{layer_name}: {num_heads} heads not divisible by {num_kv_heads}")
        if logits_soft_cap is not None and logits_soft_cap <= 0:
            raise ValueError(f"{layer_name}: logits_soft_cap must be > 0, got {logits_soft_cap}")
        self.layer_name = layer_name
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.attn_type = attn_type
        self.logits_soft_cap = logits_soft_cap
        self.impl: AttentionImpl | None = None
        self.kv_cache: torch.Tensor | None = None  # bound by the worker after allocation
        self.kv_scales = KVCacheScales()  # an FP8 cache's; loaded before bind_backend

    def bind_backend(
        self,
        backend: type[AttentionBackend],
        config: dict[str, Any] | None = None,
        kv_cache_dtype: str = "auto",
    ) -> None:
        """Create this layer's kernel; `config` (--attention-backend-config) adds keywords;
        `kv_cache_dtype` (a resolved --kv-cache-dtype) is what the cache bound later holds.

        Raises ValueError when the backend cannot serve the layer (`impl_keywords`) or
        read its cache.
        """
        impl = partial(
            backend.get_impl_cls(),
            self.num_heads,
            self.head_size,
            self.scale,
            self.num_kv_heads,
            self.sliding_window,
            self.attn_type,
            **self.impl_keywords(backend),
            **self._kv_cache_keywords(backend, kv_cache_dtype),
        )
        self.impl = build_component(impl, config or {}, "--attention-backend-config")

    def impl_keywords(self, backend: type[AttentionBackend]) -> dict[str, Any]:
        """The keywords this layer's impl takes besides `AttentionImpl`'s positional
        arguments; ValueError when `backend` cannot serve the layer.

        A soft-capping layer passes `logits_soft_cap`, and only then: the constructors of
        backends without the capability need not take it (the selector refuses such a
        backend first, given the layers' requirements).
        """
        if self.logits_soft_cap is None:
            return {}
        if not backend.capabilities.logits_soft_cap:
            raise ValueError(
                f"{self.layer_name}: attention backend {backend.name!r} cannot serve "
                "logit soft-capping (logits_soft_cap)"
            )
        return {"logits_soft_cap": self.logits_soft_cap}

    def _kv_cache_keywords(
        self, backend: type[AttentionBackend], kv_cache_dtype: str
    ) -> dict[str, Any]:
        """An FP8 cache's `kv_scales`, passed only then (as `logits_soft_cap`: the
        constructors of backends that read no FP8 cache need not take it)."""
        if kv_cache_dtype == "auto":
            return {}
        if kv_cache_dtype not in backend.capabilities.kv_cache_dtypes:
            raise ValueError(
                f"{self.layer_name}: attention backend {backend.name!r} cannot read a "
                f"{kv_cache_dtype} KV cache"
            )
        return {"kv_scales": self.kv_scales}

    def set_kv_scale(self, field: str, loaded: torch.Tensor) -> None:
        """Set `field` ("k_scale" or "v_scale") from a checkpoint tensor holding one
        positive, finite value (a per-tensor scale); ValueError otherwise."""
        values = loaded.float().flatten()
        if values.numel() != 1:
            raise ValueError(
                f"{self.layer_name}.{field}: expected one scale for the layer, got shape "
                f"{tuple(loaded.shape)}"
            )
        value = values.item()
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{self.layer_name}.{field}: a scale must be positive, got {value}")
        self.kv_scales = replace(self.kv_scales, **{field: value})

    def kv_cache_spec(self, block_size: int, dtype: torch.dtype) -> AttentionSpec:
        """What this layer keeps per block (the worker reports it to the engine)."""
        common = dict(
            block_size=block_size,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            dtype=dtype,
        )
        if self.sliding_window is not None:
            return SlidingWindowSpec(sliding_window=self.sliding_window, **common)
        return FullAttentionSpec(**common)

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads * head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads * head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads * head_size]
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_size]
        if torch.compiler.is_compiling():
            # Allocated in the graph before the op, so under piecewise graph capture the
            # output lives in the captured piece before attention, at a fixed address.
            output = query.new_empty(query.shape[0], self.output_size)
            UNIFIED_ATTENTION.overload(query, key, value, output, self.layer_name)
            return output
        return self.attend(query, key, value)

    def lean(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """`forward` outside torch.compile's tracing, where lean callables run
        (core.models.lean_step)."""
        return self.attend

    def attend(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads * head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads * head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads * head_size]
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_size]
        """Run the bound kernel on this step's metadata (zeros in a dummy run)."""
        per_layer = get_forward_context().attn_metadata
        if self.layer_name not in per_layer:
            if self.impl is not None:
                self.impl.record_kernel_problems(self.split_heads(query, key, value)[0])
            return query.new_zeros(query.shape[0], self.output_size)
        if self.impl is None or self.kv_cache is None:
            raise RuntimeError(f"{self.layer_name}: no backend or KV cache bound")
        num_tokens = query.shape[0]
        metadata = per_layer[self.layer_name]
        connector = get_forward_context().kv_connector
        if connector is not None:
            connector.wait_for_layer_load(self.layer_name)
        out = self.impl.forward(*self.split_heads(query, key, value), self.kv_cache, metadata)
        if connector is not None:
            connector.save_kv_layer(self.layer_name, self.kv_cache, metadata)
        return out.reshape(num_tokens, self.output_size)

    @property
    def output_size(self) -> int:
        """The width of the layer's output per token."""
        return self.num_heads * self.head_size

    def split_heads(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """query, key, value as the impl takes them: [T, heads, head size] views."""
        num_tokens = query.shape[0]
        return (
            query.view(num_tokens, self.num_heads, self.head_size),
            key.view(num_tokens, self.num_kv_heads, self.head_size),
            value.view(num_tokens, self.num_kv_heads, self.head_size),
        )


def load_kv_scale(model: nn.Module, hf_name: str, loaded: torch.Tensor) -> bool:
    """When the checkpoint tensor `hf_name` is the KV-cache scale of one of `model`'s
    Attention layers (`kv_scale_target`), set it there and return True; else False (the
    caller treats the tensor as any other)."""
    target = kv_scale_target(hf_name)
    if target is None:
        return False
    path, field = target
    try:
        layer = model.get_submodule(path)
    except AttributeError:
        return False
    if not isinstance(layer, Attention):
        return False
    layer.set_kv_scale(field, loaded)
    return True


def prefix_layer_names(model: nn.Module, prefix: str) -> None:
    """Prefix the `layer_name` of every Attention in `model` (before the worker binds it).

    Layer names key the KV caches and the forward context's metadata, and a model names
    its layers from its own module paths, so a second model in the same worker (a
    speculative draft) must be renamed to keep caches of its own.
    """
    for module in model.modules():
        if isinstance(module, Attention):
            module.layer_name = f"{prefix}{module.layer_name}"


def _unified_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
) -> None:
    layer = get_forward_context().attention_layers[layer_name]
    output.copy_(layer.attend(query, key, value))


def _unified_attention_fake(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
) -> None:
    return None


UNIFIED_ATTENTION = CORE_OPS.declare(
    "unified_attention(Tensor query, Tensor key, Tensor value, Tensor(a!) output, "
    "str layer_name) -> ()",
    _unified_attention,
    _unified_attention_fake,
    conformance=None,  # a seam for compiled graphs: attention backends do the work
)
"""Attention of one layer as one op writing into `output`: what a compiled graph calls
(see the module doc); graph splitting for piecewise capture cuts the graph at it."""
