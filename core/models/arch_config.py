"""ArchConfig: the architecture hyperparameters a model class is built from.

Built from a transformers-style config.json dict (what every checkpoint loader produces,
whatever the file format), so the model code depends on one typed value rather than on
transformers' config classes. Both the transformers 4 spelling (`rope_theta`,
`rope_scaling`) and the transformers 5 one (`rope_parameters`) are read, and a multimodal
model's config (the language model's keys nested under `text_config`) as well as a flat one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The activations some core model implements (each model class checks its own).
ACTIVATIONS = ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh")
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
_LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)
_DEFAULT_ROPE_THETA = 10000.0  # transformers' default for the Llama family


@dataclass(frozen=True)
class MoEConfig:
    """The mixture-of-experts hyperparameters of a decoder, in transformers' vocabulary:
    `num_experts` (Mixtral's num_local_experts), `top_k` (num_experts_per_tok), each
    expert's `intermediate_size` (moe_intermediate_size where the config has one),
    `shared_expert_intermediate_size` (0: none), `norm_topk_prob` (the top-k weights
    renormalized to sum to 1), and which layers are sparse (`decoder_sparse_step`,
    `mlp_only_layers`, DeepSeek's `first_k_dense_replace` and `moe_layer_freq`: the rest
    keep a dense MLP).

    DeepSeek-V2 adds (its names): `n_routed_experts` (num_experts), `n_shared_experts`
    (a shared MLP n_shared_experts * moe_intermediate_size wide), group-limited routing
    (`topk_method` "group_limited_greedy": the experts form `n_group` groups and a token
    picks its top_k among the `topk_group` groups of highest best score; 1 and 1 mean
    plain top-k) and `routed_scaling_factor`, which multiplies the routing weights."""

    num_experts: int
    top_k: int
    intermediate_size: int
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> MoEConfig | None:
        """None for a dense model (no expert count in the config)."""
        num_experts = (
            d.get("num_local_experts") or d.get("num_experts") or d.get("n_routed_experts")
        )
        if not num_experts:
            return None
        top_k = int(_required(d, "num_experts_per_tok"))
        if not 1 <= top_k <= int(num_experts):
            raise ValueError(f"config 'num_experts_per_tok' ({top_k}) should be 1.."
                             f"{num_experts} (the experts)")  # fmt: skip
        intermediate_size = int(d.get("moe_intermediate_size") or _required(d, "intermediate_size"))
        shared = d.get("shared_expert_intermediate_size") or (
            int(d.get("n_shared_experts") or 0) * intermediate_size
        )
        n_group, topk_group = _expert_groups(d, int(num_experts), top_k)
        return cls(
            num_experts=int(num_experts),
            top_k=top_k,
            intermediate_size=intermediate_size,
            shared_expert_intermediate_size=int(shared),
            norm_topk_prob=bool(d.get("norm_topk_prob", False)),
            decoder_sparse_step=int(d.get("decoder_sparse_step") or 1),
            mlp_only_layers=tuple(int(i) for i in d.get("mlp_only_layers") or ()),
            first_k_dense_replace=int(d.get("first_k_dense_replace") or 0),
            moe_layer_freq=int(d.get("moe_layer_freq") or 1),
            n_group=n_group,
            topk_group=topk_group,
            routed_scaling_factor=float(d.get("routed_scaling_factor") or 1.0),
        )

    def is_sparse(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` has experts (else a dense MLP)."""
        return (
            layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
            and layer_idx >= self.first_k_dense_replace
            and layer_idx % self.moe_layer_freq == 0
        )


def _expert_groups(d: dict[str, Any], num_experts: int, top_k: int) -> tuple[int, int]:
    """(n_group, topk_group) of DeepSeek's routing; (1, 1) for plain top-k. ValueError
    for a routing core does not implement or groups that do not fit."""
    method = d.get("topk_method") or "greedy"
    scoring = d.get("scoring_func") or "softmax"
    if method not in ("greedy", "group_limited_greedy") or scoring != "softmax":
        raise ValueError(f"config 'topk_method' {method!r} with 'scoring_func' {scoring!r} is "
                         "not supported (greedy or group_limited_greedy, softmax)")  # fmt: skip
    if method == "greedy":
        return 1, 1
    n_group, topk_group = int(_required(d, "n_group")), int(_required(d, "topk_group"))
    if num_experts % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"config 'n_group' {n_group} / 'topk_group' {topk_group} do not fit "
                         f"{num_experts} experts")  # fmt: skip
    if top_k > topk_group * (num_experts // n_group):
        raise ValueError(f"config 'num_experts_per_tok' ({top_k}) exceeds the experts of "
                         f"{topk_group} groups")  # fmt: skip
    return n_group, topk_group


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2), in transformers' vocabulary: queries
    through a `q_lora_rank` bottleneck (None: one q_proj), keys and values compressed to
    a `kv_lora_rank` latent, each head's query/key split into `qk_nope_head_dim` plain
    and `qk_rope_head_dim` rotary dimensions, values of `v_head_dim`."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> MLAConfig | None:
        """None for a model without latent attention (no kv_lora_rank in the config)."""
        if not d.get("kv_lora_rank"):
            return None
        config = cls(
            q_lora_rank=None if not d.get("q_lora_rank") else int(d["q_lora_rank"]),
            kv_lora_rank=int(d["kv_lora_rank"]),
            qk_nope_head_dim=int(_required(d, "qk_nope_head_dim")),
            qk_rope_head_dim=int(_required(d, "qk_rope_head_dim")),
            v_head_dim=int(_required(d, "v_head_dim")),
        )
        if config.qk_rope_head_dim % 2:
            raise ValueError(f"config 'qk_rope_head_dim' should be even for RoPE, got "
                             f"{config.qk_rope_head_dim}")  # fmt: skip
        return config


@dataclass(frozen=True)
class ArchConfig:
    """Hyperparameters of a Llama-family decoder or a BERT encoder, in transformers'
    vocabulary.

    `rms_norm_eps` is the epsilon of the model's norms: config.json's `rms_norm_eps`, or
    `layer_norm_eps` for a LayerNorm model (BERT). `type_vocab_size` is BERT's number of
    token types (0 for a decoder).

    `rope_scaling` is None for plain RoPE, else a dict with "rope_type" ("linear",
    "llama3", ...) and that type's parameters (llama3: factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings); M-RoPE's "mrope_section"
    (Qwen2-VL) rides in it too, with rope_type "default" when nothing scales.
    `sliding_window` is already None when the checkpoint turns it off
    (`use_sliding_window: false`); `layer_types` says per layer whether the window
    applies. Whether an architecture honours the window at all is the model class's
    business.
    """

    architectures: tuple[str, ...]
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    hidden_act: str = "silu"
    type_vocab_size: int = 0
    moe: MoEConfig | None = None  # None: a dense model
    mla: MLAConfig | None = None  # None: no multi-head latent attention
    clip_qkv: float | None = None  # OLMoE's clamp of q, k and v (None: none)
    # Gemma: the attention scale is query_pre_attn_scalar ** -0.5 (None: head_dim's), and
    # a soft cap c bends attention scores / final logits x into c * tanh(x / c) (None: none).
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    rope_local_theta: float | None = None  # RoPE base of sliding layers (Gemma 3); None: none
    # The share of each head's dimensions that rotate (Phi-4-mini: 0.75; `rotary_dim`).
    partial_rotary_factor: float = 1.0
    # The whole config.json dict, for what a model class reads beyond the decoder's
    # hyperparameters (a vision-language model's `vision_config` and image token ids).
    hf_config: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> ArchConfig:
        """Read a config.json dict; ValueError naming a missing or invalid key.

        A vision-language config is read from its `text_config` (see `_text_config`).
        """
        hf_config, d = d, _text_config(d)
        architectures = _required(d, "architectures")
        if not isinstance(architectures, list) or not architectures:
            raise ValueError(f"config 'architectures' should be a non-empty list: {architectures}")
        # Gemma names its MLP's activation `hidden_activation` (a `hidden_act` beside it is
        # not what transformers runs).
        hidden_act = d.get("hidden_activation") or d.get("hidden_act", "silu")
        if hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"config 'hidden_act' {hidden_act!r} is not supported (one of {ACTIVATIONS})"
            )
        num_layers = int(_required(d, "num_hidden_layers"))
        rope_theta, rope_scaling = _rope(d)
        sliding_window = d.get("sliding_window") if d.get("use_sliding_window", True) else None
        config = cls(
            architectures=tuple(architectures),
            vocab_size=int(_required(d, "vocab_size")),
            hidden_size=int(_required(d, "hidden_size")),
            intermediate_size=int(_required(d, "intermediate_size")),
            num_hidden_layers=num_layers,
            num_attention_heads=int(_required(d, "num_attention_heads")),
            num_key_value_heads=int(
                d.get("num_key_value_heads") or _required(d, "num_attention_heads")
            ),
            head_dim=_head_dim(d),
            rms_norm_eps=_norm_eps(d),
            rope_theta=rope_theta,
            max_position_embeddings=int(_required(d, "max_position_embeddings")),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            sliding_window=None if sliding_window is None else int(sliding_window),
            layer_types=_layer_types(d, num_layers, sliding_window),
            attention_bias=bool(d.get("attention_bias", False)),
            mlp_bias=bool(d.get("mlp_bias", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_token_ids(d.get("eos_token_id")),
            hidden_act=hidden_act,
            type_vocab_size=int(d.get("type_vocab_size") or 0),
            moe=MoEConfig.from_hf(d),
            mla=MLAConfig.from_hf(d),
            clip_qkv=None if d.get("clip_qkv") is None else float(d["clip_qkv"]),
            query_pre_attn_scalar=_optional_float(d, "query_pre_attn_scalar"),
            attn_logit_softcapping=_optional_float(d, "attn_logit_softcapping"),
            final_logit_softcapping=_optional_float(d, "final_logit_softcapping"),
            rope_local_theta=_local_rope_theta(d),
            partial_rotary_factor=_partial_rotary_factor(d),
            hf_config=hf_config,
        )
        config._validate()
        return config

    @property
    def rotary_dim(self) -> int:
        """How many leading dimensions of each query / key head RoPE rotates."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def eos_token_id(self) -> int | None:
        """The primary end-of-sequence id: the first of `eos_token_ids` (config.json may
        list several, e.g. Llama 3's end-of-turn ids; the rest are extra stop tokens)."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    def layer_sliding_window(self, layer_idx: int) -> int | None:
        """The window of layer `layer_idx` (None: full attention)."""
        if self.layer_types[layer_idx] == SLIDING_ATTENTION:
            return self.sliding_window
        return None

    def check_tensor_parallel(self, tp_size: int) -> None:
        """ValueError naming --tensor-parallel-size when the model cannot be split into
        `tp_size` equal shares: attention heads, KV heads (or their replicas, when there are
        fewer KV heads than ranks) and MLP width must divide evenly (the vocabulary is
        padded)."""
        if tp_size == 1:
            return
        flag = f"--tensor-parallel-size {tp_size}"
        kv = self.num_key_value_heads
        problems = []
        if self.num_attention_heads % tp_size:
            problems.append(f"the {self.num_attention_heads} attention heads")
        if (kv % tp_size) if kv >= tp_size else (tp_size % kv):
            problems.append(f"the {kv} KV heads (nor is it a multiple of them)")
        if self.intermediate_size % tp_size:
            problems.append(f"the MLP width {self.intermediate_size}")
        if self.moe is not None and self.moe.intermediate_size % tp_size:
            problems.append(f"the experts' width {self.moe.intermediate_size}")
        shared = 0 if self.moe is None else self.moe.shared_expert_intermediate_size
        if shared % tp_size:
            problems.append(f"the shared expert's width {shared}")
        if problems:
            raise ValueError(
                f"{flag} does not divide {', '.join(problems)} of this model; choose a size "
                "that does"
            )

    def check_expert_parallel(
        self, ranks: int, ranks_flags: str, enable_expert_parallel: bool, num_redundant_experts: int
    ) -> None:
        """ValueError naming the flags when the experts cannot be shared whole among the
        `ranks` expert-parallel ranks (`ranks_flags` says which flags make them): a dense
        model, experts (with the redundant slots) that do not divide evenly, or more
        redundant slots than one replica of each expert per rank."""
        if not enable_expert_parallel:
            return
        if self.moe is None:
            raise ValueError(
                f"--enable-expert-parallel: {', '.join(self.architectures)} has no experts"
            )
        experts, spare = self.moe.num_experts, num_redundant_experts
        if (experts + spare) % ranks:
            raise ValueError(
                f"--enable-expert-parallel with {ranks_flags}: the {experts} experts and "
                f"{spare} redundant slots (--eplb-config num_redundant_experts) do not divide "
                f"evenly over {ranks} ranks"
            )
        if spare > experts * (ranks - 1):
            raise ValueError(
                f"--eplb-config num_redundant_experts {spare}: at most {experts * (ranks - 1)}"
                f" fit ({experts} experts, one replica of each per rank on {ranks} ranks)"
            )

    def _validate(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"config 'num_attention_heads' ({self.num_attention_heads}) is not a multiple "
                f"of 'num_key_value_heads' ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"config 'head_dim' should be even for RoPE, got {self.head_dim}")


def _text_config(d: dict[str, Any]) -> dict[str, Any]:
    """The language model's keys: a multimodal config's `text_config` (transformers 5 nests
    them there for Llava and Qwen2-VL), else `d` itself.

    `architectures` is the top level's (the checkpoint's class, not the decoder's), and the
    embeddings are tied when either level says so: transformers' Llava and Qwen2-VL configs
    carry a text config's `tie_word_embeddings: true` up to the top, where it is read.
    """
    text = d.get("text_config")
    if not isinstance(text, dict):
        return d
    tied = bool(d.get("tie_word_embeddings") or text.get("tie_word_embeddings"))
    architectures = d.get("architectures") or text.get("architectures")
    return {**text, "architectures": architectures, "tie_word_embeddings": tied}


def _required(d: dict[str, Any], key: str) -> Any:
    if d.get(key) is None:
        raise ValueError(f"model config is missing {key!r}")
    return d[key]


def _norm_eps(d: dict[str, Any]) -> float:
    if d.get("rms_norm_eps") is None and d.get("layer_norm_eps") is not None:
        return float(d["layer_norm_eps"])
    return float(_required(d, "rms_norm_eps"))


def _head_dim(d: dict[str, Any]) -> int:
    if d.get("head_dim"):
        return int(d["head_dim"])
    hidden, heads = int(_required(d, "hidden_size")), int(_required(d, "num_attention_heads"))
    if hidden % heads:
        raise ValueError(
            f"config needs 'head_dim': {hidden} hidden not a multiple of {heads} heads"
        )
    return hidden // heads


def _rope(d: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either transformers spelling.

    transformers 5 writes one `rope_parameters` dict holding rope_theta and the scaling,
    or one such dict per layer type (Gemma 3: these are the full-attention layers'); older
    configs have a top-level `rope_theta` and a `rope_scaling` dict whose type key is
    "type" or "rope_type". A "default" type means no scaling. An `mrope_section` (Qwen2-VL's
    M-RoPE; its first configs call the type "mrope") is kept in the scaling dict, whatever
    the type: the rotary embedding reads it there.
    """
    rope_parameters = d.get("rope_parameters") or {}
    rope_parameters = rope_parameters.get(FULL_ATTENTION, rope_parameters)
    params = {**(d.get("rope_scaling") or {}), **rope_parameters}
    rope_theta = float(params.pop("rope_theta", None) or d.get("rope_theta") or _DEFAULT_ROPE_THETA)
    legacy_type = params.pop("type", None)
    rope_type = params.pop("rope_type", None) or legacy_type or "default"
    rope_type = "default" if rope_type == "mrope" else rope_type
    params.pop("partial_rotary_factor", None)  # not scaling: ArchConfig.partial_rotary_factor
    if rope_type == "default":
        if params.get("mrope_section") is None:
            return rope_theta, None
        return rope_theta, {"rope_type": "default", "mrope_section": list(params["mrope_section"])}
    if rope_type in ("llama3", "yarn", "longrope", "su"):  # "su": Phi-3's first longrope
        # transformers' rule: a top-level value wins (Phi-3 keeps it there), else the
        # scaling's own, else the model's length.
        params["original_max_position_embeddings"] = int(
            d.get("original_max_position_embeddings")
            or params.get("original_max_position_embeddings")
            or _required(d, "max_position_embeddings")
        )
    return rope_theta, {"rope_type": rope_type, **params}


def _partial_rotary_factor(d: dict[str, Any]) -> float:
    """transformers 5 keeps `partial_rotary_factor` in `rope_parameters`; older configs
    (Phi-4-mini's) at the top level."""
    rope_parameters = d.get("rope_parameters") or {}
    rope_parameters = rope_parameters.get(FULL_ATTENTION, rope_parameters)
    value = rope_parameters.get("partial_rotary_factor") or d.get("partial_rotary_factor")
    return 1.0 if value is None else float(value)


def _local_rope_theta(d: dict[str, Any]) -> float | None:
    """The RoPE base of the sliding layers where it differs from the full ones' (Gemma 3:
    `rope_local_base_freq`, or transformers 5's per-layer-type `rope_parameters`)."""
    per_type = (d.get("rope_parameters") or {}).get(SLIDING_ATTENTION) or {}
    theta = per_type.get("rope_theta") or d.get("rope_local_base_freq")
    return None if theta is None else float(theta)


def _optional_float(d: dict[str, Any], key: str) -> float | None:
    return None if d.get(key) is None else float(d[key])


# Every n-th layer is full attention, the others slide, in configs listing neither
# `layer_types` nor `sliding_window_pattern` (transformers' defaults for these models).
_SLIDING_WINDOW_PATTERNS = {"gemma2": 2, "gemma3_text": 6}


def _layer_types(d: dict[str, Any], num_layers: int, sliding_window: Any) -> tuple[str, ...]:
    """Per layer, full or sliding attention.

    An explicit `layer_types` wins; then a `sliding_window_pattern` n (Gemma: every n-th
    layer is full, the others slide); otherwise, as transformers does for Qwen2/Qwen3, the
    layers from `max_window_layers` on slide (Mistral has no such key: all of them).
    """
    if d.get("layer_types"):
        types = tuple(d["layer_types"])
        if len(types) != num_layers or any(t not in _LAYER_TYPES for t in types):
            raise ValueError(
                f"config 'layer_types' should list {num_layers} of {_LAYER_TYPES}: {types}"
            )
        return types
    pattern = d.get("sliding_window_pattern") or _SLIDING_WINDOW_PATTERNS.get(d.get("model_type"))
    if sliding_window is not None and pattern:
        return tuple(
            FULL_ATTENTION if (i + 1) % int(pattern) == 0 else SLIDING_ATTENTION
            for i in range(num_layers)
        )
    first_sliding = int(d.get("max_window_layers") or 0)
    return tuple(
        SLIDING_ATTENTION if sliding_window is not None and i >= first_sliding else FULL_ATTENTION
        for i in range(num_layers)
    )


def _token_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)
