"""DeepSeek-V2 (and V2-Lite): multi-head latent attention and a mixture of experts with
shared experts.

Attention (MLA, `core.attention.mla`): a token's keys and values of every head come from
one latent, the output of `kv_a_proj_with_mqa`: kv_lora_rank values (normalized by
`kv_a_layernorm`), which `kv_b_proj` expands into each head's plain key and value, and
qk_rope_head_dim values of a rotary key shared by all heads. The KV cache keeps the
latent. Queries come from `q_proj`, or through a q_lora_rank bottleneck (`q_a_proj`,
`q_a_layernorm`, `q_b_proj`); each head's is qk_nope_head_dim plain values then
qk_rope_head_dim rotary ones.

RoPE rotates the rotary parts only, in transformers' interleaved layout (pairs (2i,
2i + 1)). core's rotary op rotates pairs (i, i + D/2), so loading reorders the rotary rows
of the query and latent projections (evens first, then odds): the rotated values are the
same, stored in another order, and the products q.k that use them are unchanged.

MLP: dense for the first `first_k_dense_replace` layers (and off `moe_layer_freq`),
elsewhere routed experts (softmax, top-k, optionally within the best groups, weights
times routed_scaling_factor) plus ungated shared experts that every token goes through.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from typing import ClassVar

import torch
from torch import nn

from core.attention.interface import MLADims
from core.attention.mla import MLAAttention
from core.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_world_size
from core.models.arch_config import ArchConfig, MLAConfig
from core.models.hf_weights import ExpertParam, StackedParam, load_hf_weights
from core.models.layers import (
    LMHead,
    ReplicatedLinear,
    RMSNorm,
    RotaryEmbedding,
    TiedLMHead,
    VocabEmbedding,
)
from core.models.layers.fused_moe import FusedMoE
from core.models.layers.rotary_embedding import yarn_softmax_scale_factor
from core.models.llama import DecoderLayer, DecoderOptions, LlamaMLP, check_hidden_act
from core.models.qwen_moe import GATED_EXPERTS
from core.quantization.interface import QuantizationConfig

__all__ = ["DeepseekV2ForCausalLM"]

# transformers' DeepseekV2RMSNorm default, which its q_a / kv_a norms keep (not the
# config's rms_norm_eps).
_LATENT_NORM_EPS = 1e-6


class DeepseekV2Attention(nn.Module):
    """MLA of one layer: projections around an `MLAAttention` that caches the latent."""

    def __init__(
        self,
        config: ArchConfig,
        mla: MLAConfig,
        rotary_emb: RotaryEmbedding,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        hidden, heads, bias = config.hidden_size, config.num_attention_heads, config.attention_bias
        self.mla = mla
        self.num_heads = heads
        qk_head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank is None:
            self.q_proj = ReplicatedLinear(
                hidden, heads * qk_head_dim, False, None, f"{prefix}.q_proj", dtype
            )
        else:
            rank = mla.q_lora_rank
            self.q_a_proj = ReplicatedLinear(hidden, rank, bias, None, f"{prefix}.q_a_proj", dtype)
            self.q_a_layernorm = RMSNorm(rank, _LATENT_NORM_EPS, dtype)
            self.q_b_proj = ReplicatedLinear(
                rank, heads * qk_head_dim, False, None, f"{prefix}.q_b_proj", dtype
            )
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden, mla.kv_lora_rank + mla.qk_rope_head_dim, bias, None,
            f"{prefix}.kv_a_proj_with_mqa", dtype,
        )  # fmt: skip
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, _LATENT_NORM_EPS, dtype)
        self.kv_b_proj = ReplicatedLinear(
            mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim), False, None,
            f"{prefix}.kv_b_proj", dtype,
        )  # fmt: skip
        self.o_proj = ReplicatedLinear(
            heads * mla.v_head_dim, hidden, bias, None, f"{prefix}.o_proj", dtype
        )
        self.rotary_emb = rotary_emb  # the model's one table, shared by every layer
        dims = MLADims(mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim)
        # YaRN's mscale_all_dim scales every product q.k, rotary dimensions or not.
        scale = qk_head_dim**-0.5 * yarn_softmax_scale_factor(config.rope_scaling)
        self.attn = MLAAttention(f"{prefix}.attn", heads, scale, dims, self.kv_b_proj)

    def forward(
        self,
        positions: torch.Tensor,  # [T] int64
        hidden: torch.Tensor,  # [T, hidden]
    ) -> torch.Tensor:  # [T, hidden]
        num_tokens, mla = hidden.shape[0], self.mla
        if mla.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q = q.view(num_tokens, self.num_heads, -1)  # [T, H, Dn + Dr]
        kv_c, k_pe = self.kv_a_proj_with_mqa(hidden).split(
            [mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1
        )
        latent = torch.cat((self.kv_a_layernorm(kv_c), k_pe), dim=-1)  # [T, R + Dr]
        # Rotated in place: the query's rotary part and the latent's rotary key.
        self.rotary_emb(
            positions, q[..., mla.qk_nope_head_dim :], latent[:, None, mla.kv_lora_rank :]
        )
        return self.o_proj(self.attn(q.view(num_tokens, -1), latent))


class DeepseekV2MoE(FusedMoE):
    """The routed experts (FusedMoE: `gate`, `experts`) plus `shared_experts`, a dense
    MLP every token goes through, added ungated."""

    def __init__(self, config: ArchConfig, prefix: str, dtype: torch.dtype) -> None:
        moe = config.moe
        super().__init__(moe, config.hidden_size, moe.norm_topk_prob, prefix, dtype)
        self.shared_experts = (
            LlamaMLP(config, DecoderOptions(mlp_bias=config.mlp_bias), None,
                     f"{prefix}.shared_experts", dtype, moe.shared_expert_intermediate_size)
            if moe.shared_expert_intermediate_size
            else None
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        out = super().forward(x)
        return out if self.shared_experts is None else out + self.shared_experts(x)


class DeepseekV2Model(nn.Module):
    """Embedding, decoder layers and final norm: token ids to last hidden states."""

    def __init__(self, config: ArchConfig, prefix: str, dtype: torch.dtype) -> None:
        super().__init__()
        mla = config.mla
        self.embed_tokens = VocabEmbedding(
            config.vocab_size, config.hidden_size, dtype, None, f"{prefix}.embed_tokens"
        )
        # Rotary dimensions only; one table for all layers (it is indexed by position).
        self.rotary_emb = RotaryEmbedding(
            mla.qk_rope_head_dim, config.max_position_embeddings, config.rope_theta,
            config.rope_scaling,
        )  # fmt: skip
        self.layers = nn.ModuleList(
            _decoder_layer(config, i, self.rotary_emb, f"{prefix}.layers.{i}", dtype)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None  # [T, hidden]
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        return self.norm(hidden, residual)[0]


class DeepseekV2ForCausalLM(nn.Module):
    """DeepSeek-V2 / V2-Lite (the model interface of `core.models.llama.LlamaForCausalLM`),
    unquantized, on one rank (no tensor or pipeline parallelism yet)."""

    stacked_params: ClassVar[tuple[StackedParam, ...]] = (
        StackedParam("gate_up_proj", "gate_proj", 0),
        StackedParam("gate_up_proj", "up_proj", 1),
    )
    expert_params: ClassVar[tuple[ExpertParam, ...]] = GATED_EXPERTS
    has_lm_head: ClassVar[bool] = True

    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        _check_supported(config, quant_config)
        self.config = config
        self.model = DeepseekV2Model(config, "model", dtype)
        if config.tie_word_embeddings:
            self.lm_head: nn.Module = TiedLMHead(self.model.embed_tokens)
        else:
            self.lm_head = LMHead(config.vocab_size, config.hidden_size, dtype, None, "lm_head")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)  # [T] -> [T, hidden]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # [N, hidden] -> [N, vocab]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors (ValueError naming missing / unexpected ones),
        the rotary rows of the query and latent projections reordered for core's RoPE."""
        load_hf_weights(
            self, self._to_rotate_half(weights), self.stacked_params, self._skips_weight,
            self.expert_params,
        )  # fmt: skip

    def _to_rotate_half(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        mla = self.config.mla
        qk_head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        row_blocks = {  # module -> the size of the row blocks that end in rotary rows
            "q_proj": qk_head_dim,
            "q_b_proj": qk_head_dim,
            "kv_a_proj_with_mqa": mla.kv_lora_rank + mla.qk_rope_head_dim,
        }
        for name, tensor in weights:
            parts = name.split(".")
            if len(parts) >= 2 and parts[-2] in row_blocks:
                tensor = deinterleave_rotary_rows(
                    tensor, row_blocks[parts[-2]], mla.qk_rope_head_dim
                )
            yield name, tensor

    def _skips_weight(self, hf_name: str) -> bool:
        if "rotary_emb" in hf_name.split("."):  # recomputed, not read
            return True
        return self.config.tie_word_embeddings and hf_name == "lm_head.weight"


def _decoder_layer(
    config: ArchConfig, layer_idx: int, rotary_emb: RotaryEmbedding, prefix: str, dtype: torch.dtype
) -> DecoderLayer:
    """Layer `layer_idx`: MLA, then its experts where the config makes it sparse, else the
    dense gated MLP; pre-norm on the Llama decoder's residual stream."""
    self_attn = DeepseekV2Attention(config, config.mla, rotary_emb, f"{prefix}.self_attn", dtype)
    if config.moe is not None and config.moe.is_sparse(layer_idx):
        mlp: nn.Module = DeepseekV2MoE(config, f"{prefix}.mlp", dtype)
    else:
        options = DecoderOptions(mlp_bias=config.mlp_bias)
        mlp = LlamaMLP(config, options, None, f"{prefix}.mlp", dtype)
    norm = partial(RMSNorm, config.hidden_size, config.rms_norm_eps, dtype)
    return DecoderLayer(self_attn, mlp, norm)


def deinterleave_rotary_rows(weight: torch.Tensor, block: int, rotary: int) -> torch.Tensor:
    """`weight` (rows [N * block, ...]) with the last `rotary` rows of each block reordered
    from interleaved pairs (x0, x1), (x2, x3)... to x0, x2, ..., x1, x3, ... (the pairs
    (i, i + rotary / 2) of core's rotary op)."""
    plain = block - rotary
    pairs = torch.cat((torch.arange(0, rotary, 2), torch.arange(1, rotary, 2)))
    order = torch.cat((torch.arange(plain), plain + pairs))
    blocks = weight.reshape(-1, block, *weight.shape[1:])
    return blocks[:, order].reshape(weight.shape)


def _check_supported(config: ArchConfig, quant_config: QuantizationConfig | None) -> None:
    """ValueError naming what this implementation does not support."""
    if config.mla is None:
        raise ValueError("DeepseekV2ForCausalLM needs 'kv_lora_rank' (latent attention)")
    check_hidden_act(config, "silu", "DeepseekV2ForCausalLM")
    if quant_config is not None:
        raise ValueError(f"DeepseekV2ForCausalLM: quantization {quant_config.name!r} is not "
                         "supported yet; load the unquantized checkpoint")  # fmt: skip
    if get_tensor_model_parallel_world_size() > 1 or get_pp_group().world_size > 1:
        raise ValueError("DeepseekV2ForCausalLM does not support tensor or pipeline "
                         "parallelism yet: use --tensor-parallel-size 1 "
                         "--pipeline-parallel-size 1")  # fmt: skip
