"""Gemma 2, and the decoder Gemma 3 (text) extends.

What sets Gemma apart from the Llama decoder: its RMSNorm scales by (1 + weight); each
layer normalizes the attention and MLP outputs too (four norms a layer); the embedding
is scaled by sqrt(hidden_size); the MLP gates with GELU (tanh); the attention scale is
`query_pre_attn_scalar ** -0.5`; attention scores and final logits are soft-capped
(c * tanh(x / c)); and layers alternate between a sliding window and full attention, so
their KV caches fall in two groups (`Attention.kv_cache_spec`: SlidingWindowSpec and
FullAttentionSpec), each freeing what its layers no longer see.

The layers keep `LlamaModel`'s residual-stream convention (a layer returns its output
and the stream before it, the next norm adds them), so the model reuses LlamaModel's
forward, pipeline stages included, and LlamaForCausalLM's weight loading.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch
from torch import nn

from core.attention.layer import Attention
from core.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_world_size
from core.models.arch_config import SLIDING_ATTENTION, ArchConfig
from core.models.layers import (
    GeluTanhAndMul,
    GemmaRMSNorm,
    LMHead,
    QKVLinear,
    RotaryEmbedding,
    RowParallelLinear,
    TiedLMHead,
    VocabEmbedding,
)
from core.models.llama import DecoderOptions, LlamaForCausalLM, LlamaMLP, LlamaModel
from core.models.pipeline import MissingLayer, stage_layers
from core.quantization.interface import QuantizationConfig

__all__ = ["Gemma2ForCausalLM", "GemmaOptions"]


@dataclass(frozen=True)
class GemmaOptions:
    """Where Gemma 3 (text) differs from Gemma 2, as switches on one decoder."""

    qk_norm: bool = False  # Gemma RMSNorm of each query / key head before RoPE
    # The unscaled RoPE base of the sliding layers when the config names none (None: the
    # sliding layers share the full layers' RoPE).
    local_rope_theta: float | None = None


class GemmaMLP(LlamaMLP):
    """The gated MLP with GELU (tanh approximation) in place of SiLU, no biases."""

    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(config, DecoderOptions(), quant_config, prefix, dtype)
        self.act_fn = GeluTanhAndMul()


class GemmaAttention(nn.Module):
    def __init__(
        self,
        config: ArchConfig,
        options: GemmaOptions,
        layer_idx: int,
        rotary_emb: RotaryEmbedding,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        self.num_heads = config.num_attention_heads // tp_size
        self.num_kv_heads = max(config.num_key_value_heads // tp_size, 1)
        self.head_dim = config.head_dim
        self.qkv_proj = QKVLinear(
            config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=config.attention_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
            dtype=dtype,
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim,
            config.hidden_size,
            bias=config.attention_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
            dtype=dtype,
        )
        head_norm = partial(GemmaRMSNorm, self.head_dim, config.rms_norm_eps, dtype)
        self.q_norm = head_norm() if options.qk_norm else nn.Identity()
        self.k_norm = head_norm() if options.qk_norm else nn.Identity()
        self.rotary_emb = rotary_emb  # the table of this layer's type, shared with its peers
        scalar = config.query_pre_attn_scalar or self.head_dim
        self.attn = Attention(
            layer_name=f"{prefix}.attn",
            num_heads=self.num_heads,
            head_size=self.head_dim,
            scale=scalar**-0.5,
            num_kv_heads=self.num_kv_heads,
            sliding_window=config.layer_sliding_window(layer_idx),
            logits_soft_cap=config.attn_logit_softcapping,
        )

    def forward(
        self,
        positions: torch.Tensor,  # [T] int64
        hidden: torch.Tensor,  # [T, hidden]
    ) -> torch.Tensor:  # [T, hidden]
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [T, (H + 2 * H_kv) * D]
        kv_size = self.qkv_proj.kv_size
        q, k, v = qkv.split([self.qkv_proj.q_size, kv_size, kv_size], dim=-1)
        q = self.q_norm(q.view(num_tokens, self.num_heads, self.head_dim))  # [T, H, D]
        k = self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim))  # [T, H_kv, D]
        self.rotary_emb(positions, q, k)
        out = self.attn(q.view(num_tokens, -1), k.view(num_tokens, -1), v)  # [T, H * D]
        return self.o_proj(out)


class GemmaDecoderLayer(nn.Module):
    """Norms before and after both the attention and the MLP, on LlamaDecoderLayer's
    residual stream: the pre-norms add the stream (`GemmaRMSNorm(x, residual)`), so
    h + post_norm(attn(pre_norm(h))) is summed exactly where transformers sums it."""

    def __init__(
        self,
        config: ArchConfig,
        options: GemmaOptions,
        layer_idx: int,
        rotary_emb: RotaryEmbedding,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        norm = partial(GemmaRMSNorm, config.hidden_size, config.rms_norm_eps, dtype)
        self.input_layernorm = norm()
        self.self_attn = GemmaAttention(
            config, options, layer_idx, rotary_emb, quant_config, f"{prefix}.self_attn", dtype
        )
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.mlp = GemmaMLP(config, quant_config, f"{prefix}.mlp", dtype)
        self.post_feedforward_layernorm = norm()

    def forward(
        self,
        positions: torch.Tensor,  # [T] int64
        hidden: torch.Tensor,  # [T, hidden]: the previous layer's MLP output, or the input
        residual: torch.Tensor | None,  # [T, hidden]; None: `hidden` is the whole stream
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (MLP output, residual before it), [T, hidden]
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class ScaledVocabEmbedding(VocabEmbedding):
    """Embedding rows times sqrt(hidden_size), the factor rounded to float32 and then to
    the rows' dtype (as transformers' Gemma embedding): the tied LM head reads the
    unscaled matrix."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden_size]
        rows = super().forward(input_ids)
        return rows * torch.tensor(rows.shape[-1] ** 0.5).to(rows.dtype)


class GemmaModel(LlamaModel):
    """The scaled embedding, Gemma decoder layers and final norm, run by LlamaModel's
    forward: this builds the attributes it reads (stage bounds, `embed_tokens`, `layers`,
    `norm`) the way LlamaModel does, with Gemma's modules and a RoPE table per layer type.
    """

    def __init__(
        self,
        config: ArchConfig,
        options: GemmaOptions,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        nn.Module.__init__(self)
        pp = get_pp_group()
        self.is_first_stage, self.is_last_stage = pp.is_first_rank, pp.is_last_rank
        self.start, self.end = stage_layers(
            config.num_hidden_layers, pp.rank_in_group, pp.world_size
        )
        needs_embedding = self.is_first_stage or (self.is_last_stage and config.tie_word_embeddings)
        self.embed_tokens = (
            ScaledVocabEmbedding(
                config.vocab_size, config.hidden_size, dtype, quant_config, f"{prefix}.embed_tokens"
            )
            if needs_embedding
            else MissingLayer()
        )
        self.rotary_emb = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
        )
        local_theta = config.rope_local_theta or options.local_rope_theta
        self.local_rotary_emb = (
            self.rotary_emb
            if local_theta is None
            else RotaryEmbedding(config.head_dim, config.max_position_embeddings, local_theta)
        )
        self.layers = nn.ModuleList(
            self._layer(config, options, i, quant_config, f"{prefix}.layers.{i}", dtype)
            if self.start <= i < self.end
            else MissingLayer()
            for i in range(config.num_hidden_layers)
        )
        self.norm = (
            GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
            if self.is_last_stage
            else MissingLayer()
        )

    def _layer(
        self,
        config: ArchConfig,
        options: GemmaOptions,
        layer_idx: int,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> GemmaDecoderLayer:
        """Layer `layer_idx`, rotated by the RoPE table of its type."""
        sliding = config.layer_types[layer_idx] == SLIDING_ATTENTION
        rotary = self.local_rotary_emb if sliding else self.rotary_emb
        return GemmaDecoderLayer(config, options, layer_idx, rotary, quant_config, prefix, dtype)


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Gemma 2: soft-capped attention scores and final logits, alternating sliding and
    full layers, tied embeddings. The model-class interface is LlamaForCausalLM's."""

    gemma_options: ClassVar[GemmaOptions] = GemmaOptions()

    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        nn.Module.__init__(self)
        if config.hidden_act != "gelu_pytorch_tanh":  # the gated MLP is GeluTanhAndMul
            raise ValueError(
                f"config 'hidden_activation' {config.hidden_act!r} is not supported by "
                f"{type(self).__name__} (only 'gelu_pytorch_tanh')"
            )
        self.config = config
        self.model = GemmaModel(config, self.gemma_options, quant_config, "model", dtype)
        if not self.model.is_last_stage:
            self.lm_head: nn.Module = MissingLayer()
        elif config.tie_word_embeddings:
            self.lm_head = TiedLMHead(self.model.embed_tokens)
        else:
            self.lm_head = LMHead(
                config.vocab_size, config.hidden_size, dtype, quant_config, "lm_head"
            )

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)  # [N, hidden] -> [N, vocab]
        cap = self.config.final_logit_softcapping
        if cap is None:
            return logits
        return torch.tanh(logits / cap) * cap
