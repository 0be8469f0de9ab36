"""The rope_scaling types against transformers' own RoPE functions: the same cos/sin
tables for several head sizes, bases, partial rotary factors and scaling parameters, read
from config.json dicts as checkpoints write them (rope_type or the legacy type key)."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, yarn_apply_mscale
from transformers.models.phi3 import modeling_phi3

from core.models import ArchConfig
from core.models.layers import RotaryEmbedding
from core.models.layers.rotary_embedding import yarn_softmax_scale_factor

MAX_POSITIONS = 128
ORIGINAL = 32


def longrope(rotary_dim: int, **extra) -> dict:
    """LongRoPE factors for `rotary_dim`: short ones near 1, long ones growing to ~30."""
    num = rotary_dim // 2
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(num)],
        "long_factor": [1.0 + 30.0 * i / num for i in range(num)],
        **extra,
    }


# name -> rope_scaling as config.json spells it (a function of the rotated dimensions).
SCALINGS = {
    "linear": lambda dim: {"rope_type": "linear", "factor": 4.0},
    "dynamic": lambda dim: {"rope_type": "dynamic", "factor": 2.0},
    "dynamic-legacy-type-key": lambda dim: {"type": "dynamic", "factor": 6.0},
    "yarn": lambda dim: {"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": ORIGINAL},
    "yarn-betas-untruncated": lambda dim: {
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL,
        "beta_fast": 16, "beta_slow": 2, "truncate": False},
    # DeepSeek's spelling: mscale / mscale_all_dim set the attention factor.
    "yarn-deepseek-mscale": lambda dim: {
        "type": "yarn", "factor": 40.0, "original_max_position_embeddings": ORIGINAL,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8},
    "yarn-attention-factor": lambda dim: {
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": ORIGINAL,
        "attention_factor": 1.3},
    "llama3": lambda dim: {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": ORIGINAL},
}  # fmt: skip
LONGROPES = {
    "longrope": lambda dim: longrope(dim),
    "longrope-attention-factor": lambda dim: longrope(dim, attention_factor=1.2),
    "su-legacy-type-key": lambda dim: {**longrope(dim, type="su"), "rope_type": None},
}
# (head_dim, rope_theta, partial_rotary_factor)
GEOMETRIES = [(16, 10000.0, 1.0), (64, 500000.0, 0.5), (96, 10000.0, 0.75)]


def config_json(architecture: str, head_dim: int, theta: float, partial: float, scaling: dict):
    """A transformers 4 style config.json: top-level rope_theta, partial_rotary_factor and
    (Phi-3) original_max_position_embeddings, the scaling in rope_scaling."""
    return dict(
        architectures=[architecture], hidden_size=4 * head_dim, num_attention_heads=4,
        num_key_value_heads=2, head_dim=head_dim, intermediate_size=64, num_hidden_layers=1,
        vocab_size=32, rms_norm_eps=1e-5, max_position_embeddings=MAX_POSITIONS,
        rope_theta=theta, partial_rotary_factor=partial, rope_scaling=scaling,
        original_max_position_embeddings=ORIGINAL, pad_token_id=None,
    )  # fmt: skip


def our_tables(raw: dict) -> tuple[torch.Tensor, torch.Tensor]:
    config = ArchConfig.from_hf(raw)
    rotary = RotaryEmbedding(
        config.head_dim, config.max_position_embeddings, config.rope_theta,
        config.rope_scaling, config.rotary_dim,
    )  # fmt: skip
    return rotary.cos_cache, rotary.sin_cache


def hf_tables(hf_config, seq_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [MAX_POSITIONS, rotary_dim / 2] as transformers' rotary forward makes
    them (positions times its inv_freq, times its attention scaling) from
    ROPE_INIT_FUNCTIONS at sequence length `seq_len`."""
    init = ROPE_INIT_FUNCTIONS[hf_config.rope_parameters["rope_type"]]
    inv_freq, attention_scaling = init(hf_config, None, seq_len)
    angles = torch.arange(MAX_POSITIONS).float()[:, None] * inv_freq
    return angles.cos() * attention_scaling, angles.sin() * attention_scaling


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "d{}-theta{:g}-partial{}".format(*g))
@pytest.mark.parametrize("name", SCALINGS)
def test_scaled_tables_match_transformers(name, geometry):
    head_dim, theta, partial = geometry
    raw = config_json("LlamaForCausalLM", head_dim, theta, partial, SCALINGS[name](0))
    hf_config = transformers.LlamaConfig(**raw)
    # Dynamic NTK: transformers' frequencies once a sequence reaches max_position * factor.
    dynamic = hf_config.rope_parameters["rope_type"] == "dynamic"
    seq_len = int(MAX_POSITIONS * hf_config.rope_parameters["factor"]) if dynamic else None

    cos, sin = our_tables(raw)

    want_cos, want_sin = hf_tables(hf_config, seq_len)
    assert cos.shape == (MAX_POSITIONS, int(head_dim * partial) // 2)
    torch.testing.assert_close(cos, want_cos)
    torch.testing.assert_close(sin, want_sin)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "d{}-theta{:g}-partial{}".format(*g))
@pytest.mark.parametrize("name", LONGROPES)
def test_longrope_tables_are_short_inside_the_original_window_and_long_past_it(name, geometry):
    head_dim, theta, partial = geometry
    scaling = {k: v for k, v in LONGROPES[name](int(head_dim * partial)).items() if v is not None}
    raw = config_json("Phi3ForCausalLM", head_dim, theta, partial, scaling)
    hf_config = transformers.Phi3Config(**raw)

    cos, sin = our_tables(raw)

    short_cos, short_sin = hf_tables(hf_config, None)  # transformers' choice up to ORIGINAL
    long_cos, long_sin = hf_tables(hf_config, ORIGINAL + 1)  # and past it
    torch.testing.assert_close(cos[:ORIGINAL], short_cos[:ORIGINAL])
    torch.testing.assert_close(sin[:ORIGINAL], short_sin[:ORIGINAL])
    torch.testing.assert_close(cos[ORIGINAL:], long_cos[ORIGINAL:])
    torch.testing.assert_close(sin[ORIGINAL:], long_sin[ORIGINAL:])
    assert not torch.allclose(short_cos[ORIGINAL:], long_cos[ORIGINAL:])  # the sets differ


def test_partial_rotary_rotates_the_leading_dimensions_of_fused_qkv_views_like_phi3():
    """Phi-4-mini: 12 of 16 dimensions rotate; the last 4 of every head pass unchanged."""
    raw = config_json("Phi3ForCausalLM", 16, 10000.0, 0.75, longrope(12))
    hf_config = transformers.Phi3Config(**raw)
    positions = torch.tensor([0, 5, 31, 32, 100, 3])  # packed requests, both factor sets
    qkv = torch.randn(6, (4 + 2 + 2) * 16)  # [T, (H + 2 * H_kv) * D]
    q, k = qkv[:, :64].view(6, 4, 16), qkv[:, 64:96].view(6, 2, 16)
    want_q, want_k = q.clone(), k.clone()
    for t, position in enumerate(positions.tolist()):  # transformers' choice per sequence
        cos, sin = modeling_phi3.Phi3RotaryEmbedding(hf_config)(q, torch.arange(position + 1)[None])
        cos, sin = cos[:, -1:], sin[:, -1:]  # [1, 1, 12]: the token's own position
        qt, kt = modeling_phi3.apply_rotary_pos_emb(
            q[t, None, :, None], k[t, None, :, None], cos, sin
        )
        want_q[t], want_k[t] = qt[0, :, 0], kt[0, :, 0]
    config = ArchConfig.from_hf(raw)
    rotary = RotaryEmbedding(16, MAX_POSITIONS, config.rope_theta, config.rope_scaling, 12)

    rotary(positions, q, k)  # in place, in qkv

    torch.testing.assert_close(q, want_q)
    torch.testing.assert_close(k, want_k)
    assert torch.equal(qkv[:, 12:16], want_q[:, 0, 12:])  # the unrotated tail of head 0


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707,
         "original_max_position_embeddings": 4096},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
        {"rope_type": "linear", "factor": 2.0},
    ],
)  # fmt: skip
def test_softmax_scale_factor_is_transformers_yarn_mscale(scaling):
    assert yarn_softmax_scale_factor(scaling) == pytest.approx(yarn_apply_mscale(scaling, 1.0))


def test_unsupported_rope_type_names_the_type_and_the_supported_ones():
    with pytest.raises(ValueError, match=r"'proportional' is not supported \(supported: .*'yarn'"):
        RotaryEmbedding(16, 64, 10000.0, {"rope_type": "proportional", "factor": 2.0})


def test_longrope_factors_of_the_wrong_length_are_named():
    scaling = {**longrope(16), "original_max_position_embeddings": 32}
    with pytest.raises(ValueError, match="'short_factor' has 8 values; .* need 4"):
        RotaryEmbedding(16, 64, 10000.0, scaling, rotary_dim=8)
