"""The Llama-family decoder, shared by Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2 and 3
and the mixtures of experts built on it (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE).

One implementation, parameterized by the ArchConfig and a few per-architecture switches
(`DecoderOptions`); the other architectures are subclasses that only choose switches.
Tokens of all scheduled requests are packed back to back ([T], no batch dimension); the
attention layers find how they split into requests in the forward context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch
from torch import nn

from core.attention.layer import Attention
from core.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_world_size
from core.models.arch_config import SLIDING_ATTENTION, ArchConfig, MoEConfig
from core.models.hf_weights import ExpertParam, StackedParam, load_hf_weights
from core.models.layer_stack import LayerStack, PlainLayer, build_stack
from core.models.layers import (
    GeluTanhAndMul,
    LMHead,
    MergedLinear,
    QKVLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    ScaledVocabEmbedding,
    SiluAndMul,
    TiedLMHead,
    VocabEmbedding,
)
from core.models.layers.fused_moe import FusedMoE
from core.models.lean_step import Lean, LeanLayer, lean
from core.models.pipeline import IntermediateTensors, MissingLayer, stage_layers
from core.quantization.interface import QuantizationConfig

# Checkpoint projections that the decoder fuses into one matmul each.
_STACKED_PARAMS = (
    StackedParam("qkv_proj", "q_proj", "q"),
    StackedParam("qkv_proj", "k_proj", "k"),
    StackedParam("qkv_proj", "v_proj", "v"),
    StackedParam("gate_up_proj", "gate_proj", 0),
    StackedParam("gate_up_proj", "up_proj", 1),
)
# The gated MLP's activation module for each config `hidden_act` a decoder may apply.
_GATED_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "silu": SiluAndMul,
    "gelu_pytorch_tanh": GeluTanhAndMul,
}


@dataclass(frozen=True)
class DecoderOptions:
    """Where the Llama-family architectures differ, as switches on one decoder."""

    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm of each query / key head before RoPE (Qwen3)
    # RMSNorm of all query / all key heads together, one statistic per token (OLMoE).
    qk_norm_across_heads: bool = False
    clip_qkv: bool = False  # clamp q, k and v to the config's clip_qkv (OLMoE)
    sliding_window: bool = False  # honour the config's sliding window on its layers
    # The config's sparse layers are mixtures of experts; renormalize their top-k weights.
    moe: bool = False
    moe_renormalize: bool = False
    # Gemma's switches (core.models.gemma2).
    hidden_act: str = "silu"  # the gated MLP's activation, the one the config must name
    norm: type[RMSNorm] = RMSNorm  # the class of every norm (Gemma: GemmaRMSNorm, 1 + w)
    sandwich_norms: bool = False  # normalize the attention and MLP outputs too
    scale_embedding: bool = False  # embedding rows times sqrt(hidden_size)
    query_pre_attn_scalar: bool = False  # scale scores by the config's scalar ** -0.5
    soft_cap: bool = False  # soft-cap attention scores at the config's attn_logit_softcapping
    # The unscaled RoPE base of a table of the sliding layers' own (None: they share it).
    local_rope_theta: float | None = None


class LlamaMLP(nn.Module):
    def __init__(
        self,
        config: ArchConfig,
        options: DecoderOptions,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
        intermediate_size: int | None = None,  # default: the config's
    ) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, intermediate_size or config.intermediate_size
        self.gate_up_proj = MergedLinear(
            hidden, [inter, inter], options.mlp_bias, quant_config, f"{prefix}.gate_up_proj", dtype
        )
        self.act_fn = _GATED_ACTIVATIONS[options.hidden_act]()
        self.down_proj = RowParallelLinear(
            inter, hidden, options.mlp_bias, quant_config, f"{prefix}.down_proj", dtype
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))

    def lean(self) -> Lean:
        gate_up, act, down = lean(self.gate_up_proj), lean(self.act_fn), lean(self.down_proj)
        return lambda x: down(act(gate_up(x)))


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: ArchConfig,
        options: DecoderOptions,
        layer_idx: int,
        rotary_emb: RotaryEmbedding,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        # This rank's heads: an equal share of the queries, and of the KV heads (or one
        # KV head, replicated, when there are fewer KV heads than ranks).
        self.num_heads = config.num_attention_heads // tp_size
        self.num_kv_heads = max(config.num_key_value_heads // tp_size, 1)
        self.head_dim = config.head_dim
        self.qkv_proj = QKVLinear(
            config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=options.qkv_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
            dtype=dtype,
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim,
            config.hidden_size,
            bias=options.o_proj_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
            dtype=dtype,
        )
        self.q_norm = _qk_norm(config, options, config.num_attention_heads, dtype)
        self.k_norm = _qk_norm(config, options, config.num_key_value_heads, dtype)
        self.norm_across_heads = options.qk_norm_across_heads
        self.clip_qkv = config.clip_qkv if options.clip_qkv else None
        self.rotary_emb = rotary_emb  # the model's table of this layer's type, shared
        window = config.layer_sliding_window(layer_idx) if options.sliding_window else None
        scalar = config.query_pre_attn_scalar if options.query_pre_attn_scalar else None
        self.attn = Attention(
            layer_name=f"{prefix}.attn",
            num_heads=self.num_heads,
            head_size=self.head_dim,
            scale=(scalar or self.head_dim) ** -0.5,
            num_kv_heads=self.num_kv_heads,
            sliding_window=window,
            logits_soft_cap=config.attn_logit_softcapping if options.soft_cap else None,
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
        if self.norm_across_heads:  # one statistic over all of a token's heads
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip_qkv is not None:  # after the norms, as transformers' OLMoE
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        # Views into qkv (or the head norms' outputs), rotated in place. `view` rather than
        # `reshape` back: a compiled graph would guard reshape's copy-or-view choice on
        # T == 1 (rows of a strided view) and trace a second graph for one-token steps.
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, H_kv, D]
        if not self.norm_across_heads:
            q, k = self.q_norm(q), self.k_norm(k)
        self.rotary_emb(positions, q, k)
        out = self.attn(q.view(num_tokens, -1), k.view(num_tokens, -1), v)  # [T, H * D]
        return self.o_proj(out)

    def lean(self) -> Lean:
        """`forward` without its options (head norms, clipping): the projections, rotary
        and attention, as `forward` orders them; the module itself where an option is set."""
        plain = isinstance(self.q_norm, nn.Identity) and isinstance(self.k_norm, nn.Identity)
        if not plain or self.clip_qkv is not None:
            return self
        qkv, rotate, attend, o = (
            lean(m) for m in (self.qkv_proj, self.rotary_emb, self.attn, self.o_proj)
        )
        sizes = [self.qkv_proj.q_size, self.qkv_proj.kv_size, self.qkv_proj.kv_size]
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim

        def attention(positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
            num_tokens = hidden.shape[0]
            q, k, v = qkv(hidden).split(sizes, dim=-1)
            q = q.view(num_tokens, heads, head_dim)
            k = k.view(num_tokens, kv_heads, head_dim)
            rotate(positions, q, k)
            return o(attend(q.view(num_tokens, -1), k.view(num_tokens, -1), v))

        return attention


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer around its attention and MLP, carrying the residual
    stream the vLLM way.

    The layer returns its MLP output and the residual stream *before* that output is
    added: the next layer's input norm adds them in the same pass that normalizes the
    sum (`core::fused_add_rms_norm`), and the model's final norm does the last add. The
    sums are the unfused layer's, in the same order, so the outputs are unchanged.

    With `sandwich_norms` (Gemma) the attention and MLP outputs are normalized too: then
    `post_attention_layernorm` (transformers' name) normalizes the attention output alone
    and `pre_feedforward_layernorm` adds the stream, so h + post_norm(attn(pre_norm(h)))
    is summed exactly where transformers sums it.
    """

    def __init__(
        self,
        self_attn: nn.Module,  # (positions [T], hidden [T, hidden]) -> [T, hidden]
        mlp: nn.Module,  # [T, hidden] -> [T, hidden]
        norm: Callable[[], RMSNorm],  # a new norm of the hidden size
        sandwich_norms: bool = False,
    ) -> None:
        super().__init__()
        self.input_layernorm = norm()
        self.self_attn = self_attn
        self.post_attention_layernorm = norm()
        self.mlp = mlp
        self.sandwich_norms = sandwich_norms
        if sandwich_norms:
            self.pre_feedforward_layernorm = norm()
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
        hidden = self.self_attn(positions, hidden)
        if not self.sandwich_norms:
            hidden, residual = self.post_attention_layernorm(hidden, residual)
            return self.mlp(hidden), residual
        hidden = self.post_attention_layernorm(hidden)
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual

    def lean(self) -> LeanLayer:
        """`forward` over its parts' lean callables (with sandwich norms: the layer)."""
        if self.sandwich_norms:
            return self
        in_norm, attention = lean(self.input_layernorm), lean(self.self_attn)
        post_norm, mlp = lean(self.post_attention_layernorm), lean(self.mlp)

        def layer(
            positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if residual is None:
                residual, hidden = hidden, in_norm(hidden)
            else:
                hidden, residual = in_norm(hidden, residual)
            hidden, residual = post_norm(attention(positions, hidden), residual)
            return mlp(hidden), residual

        return layer

    def plain(self) -> PlainLayer | None:
        """This layer as a `PlainLayer` (core.models.layer_stack), or None where a part or
        an option is not the plain Llama one."""
        attention, mlp = self.self_attn, self.mlp
        if (
            self.sandwich_norms
            or type(self) is not DecoderLayer
            or type(attention) is not LlamaAttention
            or type(mlp) is not LlamaMLP
            or type(mlp.act_fn) is not SiluAndMul
        ):
            return None
        norms = (self.input_layernorm, self.post_attention_layernorm)
        linears = (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj)
        rotary = attention.rotary_emb
        plain = (
            all(type(norm) is RMSNorm for norm in norms)
            and all(linear.bias is None and linear.partition.tp_size == 1 for linear in linears)
            and isinstance(attention.q_norm, nn.Identity)
            and isinstance(attention.k_norm, nn.Identity)
            and attention.clip_qkv is None
            and attention.attn.logits_soft_cap is None
            and type(rotary) is RotaryEmbedding
            and rotary.rotary_dim == rotary.head_dim
        )
        if not plain:
            return None
        qkv = attention.qkv_proj
        return PlainLayer(
            input_norm=self.input_layernorm,
            qkv_proj=qkv,
            rotary=rotary,
            attn=attention.attn,
            o_proj=attention.o_proj,
            post_norm=self.post_attention_layernorm,
            gate_up_proj=mlp.gate_up_proj,
            down_proj=mlp.down_proj,
            q_size=qkv.q_size,
            kv_size=qkv.kv_size,
            num_heads=attention.num_heads,
            num_kv_heads=attention.num_kv_heads,
            head_dim=attention.head_dim,
        )


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm: token ids to last hidden states.

    Under pipeline parallelism it holds its stage only (core.models.pipeline): the
    embedding on the first stage (and on the last when the head is tied to it), its
    decoder layers `start`..`end`, the final norm on the last stage.
    """

    def __init__(
        self,
        config: ArchConfig,
        options: DecoderOptions,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        pp = get_pp_group()
        self.is_first_stage, self.is_last_stage = pp.is_first_rank, pp.is_last_rank
        self.start, self.end = stage_layers(
            config.num_hidden_layers, pp.rank_in_group, pp.world_size
        )
        needs_embedding = self.is_first_stage or (self.is_last_stage and config.tie_word_embeddings)
        embedding = ScaledVocabEmbedding if options.scale_embedding else VocabEmbedding
        self.embed_tokens = (
            embedding(
                config.vocab_size, config.hidden_size, dtype, quant_config, f"{prefix}.embed_tokens"
            )
            if needs_embedding
            else MissingLayer()
        )
        # One table for all layers (it is indexed by position only), or for all but the
        # sliding ones where they have a base of their own.
        rotary_emb = partial(RotaryEmbedding, config.head_dim, config.max_position_embeddings)
        self.rotary_emb = rotary_emb(config.rope_theta, config.rope_scaling, config.rotary_dim)
        if options.local_rope_theta is not None:
            self.local_rotary_emb = rotary_emb(options.local_rope_theta, None, config.rotary_dim)
        self.layers = nn.ModuleList(
            self._layer(config, options, i, quant_config, f"{prefix}.layers.{i}", dtype)
            if self.start <= i < self.end
            else MissingLayer()
            for i in range(config.num_hidden_layers)
        )
        self.norm = (
            options.norm(config.hidden_size, config.rms_norm_eps, dtype)
            if self.is_last_stage
            else MissingLayer()
        )
        self._lean_layers: list[LeanLayer] | None = None
        self._stack: LayerStack | None = None  # made with the lean layers

    def _layer(
        self,
        config: ArchConfig,
        options: DecoderOptions,
        layer_idx: int,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> DecoderLayer:
        """Decoder layer `layer_idx`: rotated by the sliding layers' own table where they
        have one, else by the model's; its MLP the experts where the architecture and config
        make it sparse, else the dense gated MLP."""
        rotary_emb = self.rotary_emb
        if options.local_rope_theta is not None:
            sliding = config.layer_types[layer_idx] == SLIDING_ATTENTION
            rotary_emb = self.local_rotary_emb if sliding else rotary_emb
        self_attn = LlamaAttention(
            config, options, layer_idx, rotary_emb, quant_config, f"{prefix}.self_attn", dtype
        )
        moe = config.moe
        if options.moe and moe is not None and moe.is_sparse(layer_idx):
            mlp: nn.Module = _experts(config, moe, options, quant_config, f"{prefix}.mlp", dtype)
        else:
            mlp = LlamaMLP(config, options, quant_config, f"{prefix}.mlp", dtype)
        norm = partial(options.norm, config.hidden_size, config.rms_norm_eps, dtype)
        return DecoderLayer(self_attn, mlp, norm, options.sandwich_norms)

    def _stage_layers(self) -> list[LeanLayer] | nn.ModuleList:
        """This stage's decoder layers: their lean callables, made at the first eager
        forward (core.models.lean_step), or the modules while torch.compile traces."""
        if torch.compiler.is_compiling():
            return self.layers[self.start : self.end]
        if self._lean_layers is None:
            layers = self.layers[self.start : self.end]
            self._lean_layers = [lean(layer) for layer in layers]
            plain = [layer.plain() if isinstance(layer, DecoderLayer) else None for layer in layers]
            if plain and None not in plain:
                self._stack = build_stack(plain)
        return self._lean_layers

    def _run_stack(
        self, positions: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The whole stage through its layer stack (core.models.layer_stack), or None: no
        stack, the stack declined the step, or torch.compile is tracing the layers."""
        if self._stack is None or torch.compiler.is_compiling():
            return None
        return self._stack(positions, hidden, None)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        num_layers: int | None = None,
        intermediate_tensors: IntermediateTensors | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,  # [T, hidden]: instead of input_ids'
    ) -> torch.Tensor | IntermediateTensors:  # [T, hidden]
        if not self.is_first_stage:
            hidden = intermediate_tensors["hidden_states"]
        elif inputs_embeds is not None:
            hidden = inputs_embeds
        else:
            hidden = self.embed_tokens(input_ids)
        residual = None
        end = self.end if num_layers is None else min(num_layers, self.end)
        layers = self._stage_layers()[: max(end - self.start, 0)]
        stacked = self._run_stack(positions, hidden) if end == self.end else None
        if stacked is not None:
            hidden, residual = stacked
        else:
            for layer in layers:
                hidden, residual = layer(positions, hidden, residual)
        if not self.is_last_stage:
            # The stream is folded at the stage's end (the add the next layer would have
            # fused), so a stage hands the next one hidden states alone, as before.
            stream = hidden if residual is None else hidden + residual
            return IntermediateTensors({"hidden_states": stream})
        if residual is None:
            return self.norm(hidden)
        return self.norm(hidden, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Llama 2/3 (incl. llama3 RoPE scaling), SmolLM2, TinyLlama; tied embeddings optional.

    The interface every core model class implements:
    - `__init__(config, quant_config=None, dtype=torch.float32)` builds the parameters,
      uninitialized, on the current default device; `load_weights` fills them.
    - `forward(input_ids [T], positions [T]) -> hidden [T, hidden_size]`, run inside
      `core.forward_context.set_forward_context` with each attention layer's backend and
      KV cache bound (see `core.attention.layer.Attention`).
    - `compute_logits(hidden [N, hidden_size]) -> [N, vocab_size]`.
    - Optionally `forward(..., num_layers=n)`: only the first n decoder layers, then the
      final norm (an early exit: the layer-skip speculative draft).
    - `load_weights(weights)` takes `(hf_name, tensor)` pairs as a Checkpoint yields them,
      then lets every layer's method finish its weights
      (`core.models.hf_weights.process_weights_after_loading`).
    - `stacked_params`: which checkpoint modules each fused linear layer holds, as shards
      (LoRA adapters name q_proj / gate_proj...; a model without it gets no adapters on
      its fused layers).
    - Optionally, for pooling (core.pooling.runner): `pooling_only` (no language-model
      head: the model only embeds), `bidirectional` (attention sees the whole prompt) and
      `default_pooling_type`; a decoder is causal, pooled from its last token.
      `pooling_tasks` (core.pooling.tasks; embed when absent) with, for the classifier
      tasks, `classify(hidden [N, hidden_size]) -> [N, num_labels]`, its head's logits
      (core.models.decoder_classifier); an encoder may take `token_type_ids` ([T],
      `takes_token_type_ids`) and say `max_model_len(config)` (core.models.bert).
    """

    stacked_params: ClassVar[tuple[StackedParam, ...]] = _STACKED_PARAMS
    expert_params: ClassVar[tuple[ExpertParam, ...]] = ()  # a mixture of experts' names
    has_lm_head: ClassVar[bool] = True
    hidden_act_key: ClassVar[str] = "hidden_act"  # the config's name for the activation

    @classmethod
    def decoder_options(cls, config: ArchConfig) -> DecoderOptions:
        # Llama applies `attention_bias` to all four projections; it has no window.
        bias = config.attention_bias
        return DecoderOptions(qkv_bias=bias, o_proj_bias=bias, mlp_bias=config.mlp_bias)

    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        options = self.decoder_options(config)
        self.check_supported(config, options)
        self.config = config
        self.model = LlamaModel(config, options, quant_config, "model", dtype)
        if not self.model.is_last_stage or not self.has_lm_head:
            self.lm_head: nn.Module = MissingLayer()
        elif config.tie_word_embeddings:
            self.lm_head = TiedLMHead(self.model.embed_tokens)
        else:
            self.lm_head = LMHead(
                config.vocab_size, config.hidden_size, dtype, quant_config, "lm_head"
            )

    @classmethod
    def check_supported(cls, config: ArchConfig, options: DecoderOptions) -> None:
        """ValueError naming what of `config` (or of this run's parallelism) the
        architecture does not support."""
        check_hidden_act(config, options.hidden_act, cls.__name__, cls.hidden_act_key)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        num_layers: int | None = None,
        intermediate_tensors: IntermediateTensors | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        # [T] -> [T, hidden]; a stage before the last returns what the next one takes.
        # `inputs_embeds` [T, hidden] replace the embeddings of input_ids (a multimodal
        # model's merged text and image embeddings).
        return self.model(
            input_ids, positions, num_layers, intermediate_tensors, inputs_embeds=inputs_embeds
        )

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # [N, hidden] -> [N, vocab]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors; ValueError naming missing / unexpected ones.

        q/k/v and gate/up projections go to their shard of the fused parameters. RoPE
        tables some checkpoints carry ("rotary_emb.inv_freq") are recomputed, not read;
        a tied model ignores an "lm_head.weight" (it is the embedding).
        """
        if not self.has_lm_head:  # saved from the inner model: names lack its prefix
            weights = ((f"model.{name}", tensor) for name, tensor in weights)
        load_hf_weights(self, weights, self.stacked_params, self._skips_weight, self.expert_params)

    def _skips_weight(self, hf_name: str) -> bool:
        parts = hf_name.split(".")
        if "rotary_emb" in parts:
            return True
        if self.config.tie_word_embeddings and hf_name == "lm_head.weight":
            return True
        return self._in_other_stage(parts)

    def _in_other_stage(self, parts: list[str]) -> bool:
        """Whether the checkpoint tensor named `parts` belongs to another pipeline stage."""
        model = self.model
        if parts[:2] == ["model", "layers"]:
            return not model.start <= int(parts[2]) < model.end
        owner = {"model.embed_tokens": model.embed_tokens, "model.norm": model.norm}
        module = self.lm_head if parts[0] == "lm_head" else owner.get(".".join(parts[:2]))
        return isinstance(module, MissingLayer)


def check_hidden_act(
    config: ArchConfig, supported: str, model: str, key: str = "hidden_act"
) -> None:
    """ValueError unless the config's MLP activation is `supported`, the one the gated MLP
    of `model` applies (`key`: what the config calls it)."""
    if config.hidden_act != supported:
        problem = f"config {key!r} {config.hidden_act!r} is not supported by {model}"
        raise ValueError(f"{problem} (only {supported!r})")


def _qk_norm(
    config: ArchConfig, options: DecoderOptions, num_heads: int, dtype: torch.dtype
) -> nn.Module:
    """The RMSNorm of queries or keys (of `num_heads` heads) where the architecture has
    one, per head or across them; else identity."""
    if options.qk_norm_across_heads:
        return options.norm(num_heads * config.head_dim, config.rms_norm_eps, dtype)
    if options.qk_norm:
        return options.norm(config.head_dim, config.rms_norm_eps, dtype)
    return nn.Identity()


def _experts(
    config: ArchConfig,
    moe: MoEConfig,
    options: DecoderOptions,
    quant_config: QuantizationConfig | None,
    prefix: str,
    dtype: torch.dtype,
) -> FusedMoE:
    """A sparse layer's mixture of experts, with the config's shared expert if any."""
    if quant_config is not None:
        raise ValueError(
            f"{prefix}: quantized experts are not supported yet (quantization "
            f"{quant_config.name!r}); load the unquantized checkpoint"
        )
    shared = None
    if moe.shared_expert_intermediate_size:
        shared = LlamaMLP(config, options, None, f"{prefix}.shared_expert", dtype,
                          moe.shared_expert_intermediate_size)  # fmt: skip
    return FusedMoE(moe, config.hidden_size, options.moe_renormalize, prefix, dtype, shared)


class HeadlessDecoder:
    """Mixin for a decoder checkpoint saved without its language-model head (transformers'
    LlamaModel, MistralModel...: how sentence-transformers and E5-Mistral-style embedders
    save one): tensors named without the "model." prefix, no lm_head. Such a model only
    embeds (--runner pooling), from its last token unless its config says otherwise."""

    has_lm_head: ClassVar[bool] = False
    pooling_only: ClassVar[bool] = True


class LlamaHeadlessModel(HeadlessDecoder, LlamaForCausalLM):
    """transformers' LlamaModel checkpoints."""
