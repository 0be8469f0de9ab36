"""Layer parity with the transformers modules they replace, and fused-weight loading."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.llama import modeling_llama

from core.models import ArchConfig
from core.models.layers import (
    LMHead,
    MergedLinear,
    QKVLinear,
    RMSNorm,
    RotaryEmbedding,
    TiedLMHead,
    VocabEmbedding,
)
from core.models.llama import DecoderOptions, LlamaMLP
from core.ops import rms_norm_reference

HEAD_DIM = 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_reference_is_bitwise_llama_rms_norm(dtype):
    torch.manual_seed(0)
    ref = modeling_llama.LlamaRMSNorm(64, eps=1e-5).to(dtype)
    ref.weight.data.normal_()
    ours = RMSNorm(64, 1e-5, dtype)
    ours.weight.data.copy_(ref.weight.data)
    x = (torch.randn(7, 64) * 3).to(dtype)

    assert torch.equal(rms_norm_reference(x, ours.weight, ours.eps), ref(x))
    # The layer runs the kernel serving the CPU: the reference, or a plugin's (a process
    # that ran general plugins), equal to it up to the order of float32 sums.
    torch.testing.assert_close(ours(x), ref(x))


def test_rms_norm_with_a_residual_normalizes_the_sum_and_returns_it():
    norm = RMSNorm(64, 1e-5)
    norm.weight.data.normal_(generator=torch.Generator().manual_seed(0))
    x, residual = torch.randn(3, 64), torch.randn(3, 64)
    normed, new_residual = norm(x, residual)
    assert torch.equal(new_residual, x + residual)
    torch.testing.assert_close(normed, rms_norm_reference(x + residual, norm.weight, 1e-5))


ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 500000.0, "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rope", ROPES)
def test_rotary_embedding_matches_llama_rotary_embedding(rope, dtype):
    hf_config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, head_dim=HEAD_DIM,
        max_position_embeddings=512, rope_parameters=ROPES[rope],
    )  # fmt: skip
    config = ArchConfig.from_hf({**hf_config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    positions = torch.tensor([0, 1, 7, 63, 64, 300, 511, 5])  # packed requests: any order
    q, k = torch.randn(8, 4, HEAD_DIM, dtype=dtype), torch.randn(8, 2, HEAD_DIM, dtype=dtype)

    cos, sin = modeling_llama.LlamaRotaryEmbedding(hf_config)(q, positions[None])
    want_q, want_k = modeling_llama.apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin
    )  # [1, heads, T, D]
    rotary = RotaryEmbedding(
        HEAD_DIM, config.max_position_embeddings, config.rope_theta, config.rope_scaling
    )
    rotary(positions, q, k)  # in place, by the kernel serving the CPU

    torch.testing.assert_close(q, want_q[0].transpose(0, 1))
    torch.testing.assert_close(k, want_k[0].transpose(0, 1))


def test_unsupported_rope_type_is_named():
    with pytest.raises(ValueError, match="'proportional' is not supported"):
        RotaryEmbedding(HEAD_DIM, 64, 10000.0, {"rope_type": "proportional", "factor": 4.0})


def test_llama3_rope_without_original_context_is_named():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}
    scaling["high_freq_factor"] = 4.0
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        RotaryEmbedding(HEAD_DIM, 64, 10000.0, scaling)


def test_mlp_with_fused_gate_up_matches_llama_mlp():
    hf_config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96)
    torch.manual_seed(0)
    ref = modeling_llama.LlamaMLP(hf_config)
    config = ArchConfig.from_hf({**hf_config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    ours = LlamaMLP(config, DecoderOptions(), None, "mlp", torch.float32)
    gate_up, down = ours.gate_up_proj.weight, ours.down_proj.weight
    gate_up.weight_loader(gate_up, ref.gate_proj.weight.data, 0)
    gate_up.weight_loader(gate_up, ref.up_proj.weight.data, 1)
    down.weight_loader(down, ref.down_proj.weight.data)
    x = torch.randn(5, 64)

    torch.testing.assert_close(ours(x), ref(x))


def test_qkv_linear_places_each_shard_in_its_rows():
    layer = QKVLinear(8, head_dim=2, num_heads=2, num_kv_heads=1, bias=True, prefix="attn.qkv")
    for shard, size, value in (("q", 4, 1.0), ("k", 2, 2.0), ("v", 2, 3.0)):
        layer.weight.weight_loader(layer.weight, torch.full((size, 8), value), shard)
        layer.bias.weight_loader(layer.bias, torch.full((size,), value), shard)

    expected = torch.tensor([1.0] * 4 + [2.0] * 2 + [3.0] * 2)
    assert torch.equal(layer.weight[:, 0], expected) and torch.equal(layer.bias, expected)
    assert torch.equal(layer(torch.ones(1, 8)), expected[None] * 9)  # 8 inputs + bias


def test_fused_loaders_reject_bad_shard_ids_and_shapes():
    qkv = QKVLinear(8, head_dim=2, num_heads=2, num_kv_heads=1, prefix="attn.qkv")
    merged = MergedLinear(8, [3, 3], prefix="mlp.gate_up")
    with pytest.raises(ValueError, match="attn.qkv: shard id should be one of"):
        qkv.weight.weight_loader(qkv.weight, torch.zeros(4, 8), 0)
    with pytest.raises(ValueError, match=r"shape \(4, 8\) does not fit \(2, 8\)"):
        qkv.weight.weight_loader(qkv.weight, torch.zeros(4, 8), "k")
    with pytest.raises(ValueError, match="mlp.gate_up: shard id should be 0..1"):
        merged.weight.weight_loader(merged.weight, torch.zeros(3, 8), 2)


def test_tied_lm_head_is_the_embedding_matrix():
    embedding = VocabEmbedding(10, 4, torch.float32)
    embedding.weight.data.normal_()
    head = TiedLMHead(embedding)
    hidden = torch.randn(3, 4)

    assert list(head.parameters()) == []
    torch.testing.assert_close(head(hidden), hidden @ embedding.weight.T)
    embedding.weight.data.mul_(2)  # the head reads the embedding's matrix, not a copy
    torch.testing.assert_close(head(hidden), hidden @ embedding.weight.T)


def test_untied_lm_head_has_its_own_matrix():
    head = LMHead(10, 4, torch.float32)
    head.weight.data.normal_()
    hidden = torch.randn(3, 4)

    assert [name for name, _ in head.named_parameters()] == ["weight"]
    torch.testing.assert_close(head(hidden), hidden @ head.weight.T)
