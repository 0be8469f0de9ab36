"""The attention-backend interfaces: a backend, its per-step metadata builder, its kernel.

A backend declares what it can serve in one `AttentionCapabilities` value; the selector
asks `supports_combination(...)`, which returns None when the backend can serve and a
human-readable reason when it cannot, so a fallback always says why.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from core.attention.kv_cache_dtype import KVCacheScales


class AttentionType(str, enum.Enum):
    DECODER = "decoder"  # causal self-attention over the paged KV cache
    ENCODER = "encoder"
    ENCODER_ONLY = "encoder_only"
    ENCODER_DECODER = "encoder_decoder"


@dataclass(frozen=True)
class AttentionRequirements:
    """What one model's attention layers need from a backend."""

    dtype: torch.dtype
    head_size: int
    block_size: int
    kv_cache_dtype: str = "auto"
    attn_type: AttentionType = AttentionType.DECODER
    # Some layer soft-caps its attention scores (AttentionImpl's `logits_soft_cap`).
    logits_soft_cap: bool = False
    # The layers are multi-head latent attention (MLA): `head_size` is the latent's size.
    use_mla: bool = False
    # The engine runs in batch-invariant mode (core.batch_invariant).
    batch_invariant: bool = False

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        soft_cap = ", logit soft-capping" if self.logits_soft_cap else ""
        mla = " (multi-head latent)" if self.use_mla else ""
        invariant = ", batch-invariant" if self.batch_invariant else ""
        return (
            f"{dtype}, head size {self.head_size}, block size {self.block_size}, "
            f"KV-cache dtype {self.kv_cache_dtype}, {self.attn_type.value} attention{mla}"
            f"{soft_cap}{invariant}"
        )


@dataclass(frozen=True)
class AttentionCapabilities:
    """Everything a backend can serve; None means "any" for the sized fields."""

    dtypes: frozenset[torch.dtype]
    head_sizes: frozenset[int] | None = None
    block_sizes: frozenset[int] | None = None
    # The --kv-cache-dtype names (core.attention.kv_cache_dtype) whose cache it writes and
    # reads; "auto" is a cache in the model's dtype.
    kv_cache_dtypes: frozenset[str] = frozenset({"auto"})
    attention_types: frozenset[AttentionType] = frozenset({AttentionType.DECODER})
    # Serves a `logits_soft_cap` (Gemma 2). Off unless declared: a backend that ignored
    # the cap would run such a model with wrong scores rather than fail.
    logits_soft_cap: bool = False
    # Serves multi-head latent attention layers, and only those: its impl is an
    # MLA impl (see `MLADims`) and its KV cache holds one latent per token.
    mla: bool = False
    # In batch-invariant mode (core.batch_invariant) every query row, decode or prefill
    # chunk, alone or batched, attends through one per-row computation over its keys in
    # position order, bit for bit the same wherever the row is. Off unless declared.
    batch_invariant: bool = False

    def check(self, req: AttentionRequirements) -> str | None:
        """None when every requirement is met, else the first unmet one, in words."""
        if req.dtype not in self.dtypes:
            return f"dtype {req.dtype} not in {sorted(str(d) for d in self.dtypes)}"
        if self.head_sizes is not None and req.head_size not in self.head_sizes:
            return f"head size {req.head_size} not in {sorted(self.head_sizes)}"
        if self.block_sizes is not None and req.block_size not in self.block_sizes:
            return f"block size {req.block_size} not in {sorted(self.block_sizes)}"
        if req.kv_cache_dtype not in self.kv_cache_dtypes:
            return f"KV-cache dtype {req.kv_cache_dtype!r} not in {sorted(self.kv_cache_dtypes)}"
        if req.attn_type not in self.attention_types:
            return f"attention type {req.attn_type.value} not supported"
        if req.logits_soft_cap and not self.logits_soft_cap:
            return "attention logit soft-capping (logits_soft_cap) not supported"
        if req.use_mla != self.mla:
            served = "only" if self.mla else "no"
            return f"serves {served} multi-head latent attention (MLA) layers"
        if req.batch_invariant and not self.batch_invariant:
            return "batch-invariant mode (--batch-invariant) not supported"
        return None


@dataclass(frozen=True)
class MLADims:
    """The sizes of a multi-head latent attention layer (DeepSeek-V2), which an MLA
    backend's impl receives as the keyword `mla` (with `kv_b_proj`, the layer's linear
    module that expands a latent into every head's key and value).

    Each token keeps one latent in the KV cache: the compressed key-value
    [kv_lora_rank] (normalized) then the key's rotary part [qk_rope_head_dim], shared by
    all heads. A head's query is [qk_nope_head_dim | qk_rope_head_dim]; kv_b_proj's
    weight [num_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank] gives, per head,
    W_UK (the first qk_nope_head_dim rows: latent -> key) then W_UV (latent -> value).

    The impl's `forward(query, key, value, kv_cache, attn_metadata)` then takes query
    [T, H, qk_nope_head_dim + qk_rope_head_dim], key [T, 1, latent_size] (the new
    latents), value [T, 1, kv_lora_rank] (a view of key: the latent is its own value)
    and returns [T, H, v_head_dim]: softmax(scale * q.k) over the heads' full keys
    [k_nope | k_rope], times their values.
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def latent_size(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


class GraphSupport(str, enum.Enum):
    """Which batches a backend's forward can be captured in a device graph (CUDA graph)
    as a whole, attention included (FULL graphs); the others run PIECEWISE: the graph
    pieces between attention layers are captured and attention runs eagerly between them.
    """

    NEVER = "never"
    # Batches where every request has exactly one new token (pure decode).
    UNIFORM_DECODE = "uniform_decode"
    ALWAYS = "always"


@dataclass(frozen=True)
class BuilderLimits:
    """The largest step a metadata builder will see (`AttentionMetadataBuilder.reserve`)."""

    max_num_reqs: int
    max_num_tokens: int
    max_model_len: int


@dataclass
class CommonAttentionMetadata:
    """Per-step batch layout every backend builds its own metadata from.

    Tokens of all scheduled requests are packed back to back (no padding).
    """

    query_start_loc: torch.Tensor  # [num_reqs + 1] int32: start of each request's tokens
    seq_lens: torch.Tensor  # [num_reqs] int32: context length after this step
    num_computed_tokens: torch.Tensor  # [num_reqs] int32: context already in the cache
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32: block ids per request
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each new token
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int


class AttentionMetadataBuilder(ABC):
    """Turns the step's CommonAttentionMetadata into the backend's own metadata.

    One builder serves all layers of one KV-cache group; `build` runs once per step,
    before the forward, on the host.
    """

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], device: torch.device):
        self.kv_cache_spec = kv_cache_spec
        self.layer_names = layer_names
        self.device = device

    def reserve(self, limits: BuilderLimits) -> None:
        """Size persistent buffers once for the largest step, before the first `build`.

        The worker calls it after creating the builder. A builder whose backend declares
        `graph_support` other than NEVER keeps its device tensors in buffers allocated
        here and `build` copies each step's values into them (zeroing the tail), so a
        captured graph that read them reads the next step's values on replay. The
        reference builder needs none.
        """

    @abstractmethod
    def build(self, common: CommonAttentionMetadata) -> Any:
        """The metadata object every layer's AttentionImpl.forward receives this step.

        Under graph capture and replay, `common` describes a padded batch: requests past
        the real ones have no new tokens (equal query_start_loc entries) and seq_len 0,
        token rows past the real ones have slot -1 (nothing is written), and
        `max_seq_len` is the model's max length (an upper bound, so that the launch
        configuration depends on the padded batch shape only).
        """


class AttentionImpl(ABC):
    """The attention computation of one layer, reading and writing the paged KV cache.

    A backend with its own metadata and KV layout implements `forward` whole. A kernel
    plugin that replaces only the decode or the prefill computation subclasses the
    reference `core.attention.backends.torch_ref.TorchRefImpl` and overrides its public
    hook `forward_decode` or `forward_prefill`, which receive the public metadata types of
    `core.attention.paged_metadata` (`DecodeBatch`, `PrefillChunk`); the hooks' contract
    (KV layout, GQA, sliding window, soft-capping) is written on TorchRefImpl. For
    multi-head latent attention the reference is
    `core.attention.backends.mla_ref.TorchRefMLAImpl`, whose `forward_decode` takes the
    queries already absorbed into latent space.

    `logits_soft_cap` (a positive cap) is passed, as a keyword, only for a layer that has
    one, and such a layer binds only a backend whose capabilities declare
    `logits_soft_cap`: the constructors of the others need not take it. Likewise
    `kv_scales`, only for a layer whose KV cache is FP8 (a --kv-cache-dtype the backend's
    `kv_cache_dtypes` declare): `forward` then stores k / k_scale and v / v_scale in the
    cache's dtype and attends over stored * scale, in the query's dtype.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        attn_type: AttentionType = AttentionType.DECODER,
        logits_soft_cap: float | None = None,
        kv_scales: KVCacheScales | None = None,
    ) -> None:
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.attn_type = attn_type
        self.logits_soft_cap = logits_soft_cap
        self.kv_scales = kv_scales  # None: the cache holds K/V in the model's dtype

    def record_kernel_problems(self, query: torch.Tensor) -> None:
        """Called instead of `forward` in a dummy forward (no metadata, no KV cache yet)
        with the layer's query [num_tokens, num_heads, head_size]. An impl whose kernels
        are chosen by measurement (core.kernel_choice) looks them up here, so that the
        worker's recording of the model's problems sees its own; it returns nothing and
        must not touch the cache. The default does nothing."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # the layer's view, shaped by get_kv_cache_shape
        attn_metadata: Any,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        """Write key/value into the cache at the step's slots, then attend causally.

        Each new query token attends to its request's cached context plus the new tokens
        up to itself (restricted to the last `sliding_window` positions when set). With a
        `logits_soft_cap` c, each score s = scale * q.k becomes c * tanh(s / c) before
        the softmax.
        """


class AttentionBackend(ABC):
    """An attention implementation family, registered in `core.attention_backends`."""

    name: ClassVar[str]
    capabilities: ClassVar[AttentionCapabilities]
    graph_support: ClassVar[GraphSupport] = GraphSupport.NEVER
    # This family's backend for multi-head latent attention layers (capabilities.mla),
    # which the selector takes in its place for such a model; None: it has none.
    mla_backend: ClassVar[type[AttentionBackend] | None] = None

    @classmethod
    def supports_combination(cls, req: AttentionRequirements) -> str | None:
        """None when this backend can serve `req`, else the reason it cannot.

        Backends with constraints beyond the capability table (e.g. a missing kernel
        library) extend this and still return a reason, never raise.
        """
        return cls.capabilities.check(req)

    @staticmethod
    @abstractmethod
    def get_impl_cls() -> type[AttentionImpl]: ...

    @staticmethod
    @abstractmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]: ...

    @staticmethod
    @abstractmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """The shape of one layer's KV-cache view, outermost dimension num_blocks."""
