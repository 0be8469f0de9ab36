"""Phi-3 / Phi-4 in the engine, float32: greedy tokens equal transformers' for a batch whose
prompts are prefilled in chunks beside decodes, share a cached prefix and are preempted,
with plain RoPE and a sliding window, and with LongRoPE where every generation runs past
the original window. And the checkpoint's fused projections as tensor-parallel ranks hold
them."""

from __future__ import annotations

import pytest
import torch
from engine_parity import SHARED, WORDS, assert_greedy_parity
from model_harness import tiny_hf_model
from tp_checkpoint import VOCAB as TP_VOCAB

from core.distributed.parallel_state import patch_tensor_parallel
from core.model_loader import resolve_model
from core.models.hf_weights import FusedCheckpointModule, split_fused_weights
from core.models.registry import build_model
from core.testing.tiny_checkpoint import VOCAB, write_tiny_checkpoint

PROMPTS = [
    SHARED + [WORDS[5], WORDS[9]],
    [WORDS[(3 * j) % 45] for j in range(27)],
    SHARED + [WORDS[30]],
    [WORDS[1], WORDS[2], WORDS[3]],
]
MAX_TOKENS = 20  # the prompts end by position 26; the generations reach 33 to 46
# 18 blocks of 4 (2 KiB each): fewer than the second batch's 27 blocks, so requests are
# preempted and recomputed.
ENGINE = dict(max_model_len=64, kv_cache_memory="36KiB")
ORIGINAL = 32  # LongRoPE's original window, of max_position_embeddings 128
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0],
    "long_factor": [1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0],
}
NO_PAD = dict(pad_token_id=None)  # Phi-3's default pad id (32000) is outside the vocabularies
MODELS = {
    # A window that slides within the generations, yet keeps enough blocks to preempt.
    "phi3-sliding-window": dict(sliding_window=24),
    "phi3-longrope-past-the-original-window": dict(
        rope_parameters=LONGROPE, original_max_position_embeddings=ORIGINAL
    ),
}


def random_phi3(**overrides):
    """The harness's tiny Phi-3 (hidden 64, 4 heads of 16, 2 KV heads) over VOCAB."""
    special = dict(vocab_size=len(VOCAB), bos_token_id=VOCAB["<s>"], eos_token_id=VOCAB["</s>"])
    return tiny_hf_model("Phi3ForCausalLM", **{**NO_PAD, **special, **overrides})


def cached_greedy(model, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation through its KV cache, `n` tokens, eos or not.

    With LongRoPE each key keeps the rotation it was computed with (short factors inside
    the original window), which is what a paged cache does; recomputing the whole
    sequence would rotate every position with the long factors once it is past it.
    """
    tokens, cache, generated = torch.tensor([prompt]), None, []
    with torch.no_grad():
        for _ in range(n):
            output = model(tokens, cache=cache, use_cache=True)
            cache, tokens = output.cache, output.logits[:, -1:].argmax(-1)
            generated.append(int(tokens))
    return generated


@pytest.mark.parametrize("case", MODELS)
def test_greedy_tokens_equal_transformers_through_chunks_prefix_hits_and_preemption(case, tmp_path):
    hf_model = random_phi3(**MODELS[case])
    run = assert_greedy_parity(hf_model, tmp_path, PROMPTS, MAX_TOKENS, cached_greedy, **ENGINE)
    assert run.num_preemptions > 0


def rows(t: torch.Tensor, rank: int, parts: int) -> torch.Tensor:
    return t.chunk(parts, dim=0)[rank]


@pytest.mark.parametrize(("rank", "world_size"), [(0, 2), (1, 2), (3, 4)])
def test_tensor_parallel_ranks_hold_their_shares_of_the_fused_projections(
    rank, world_size, tmp_path
):
    """2 KV heads: with 4 ranks each KV head is replicated on two (rank 3 holds head 1)."""
    hf_model = tiny_hf_model("Phi3ForCausalLM", **NO_PAD)
    checkpoint = resolve_model(str(write_tiny_checkpoint(tmp_path, hf_model, TP_VOCAB)))
    with patch_tensor_parallel(rank, world_size):
        ours = dict(build_model(checkpoint).named_parameters())
    hf = dict(hf_model.named_parameters())
    layer = "model.layers.1"
    q, k, v = hf[f"{layer}.self_attn.qkv_proj.weight"].split([64, 32, 32])
    head = rank * 2 // world_size  # the KV head of this rank
    want_qkv = torch.cat([rows(q, rank, world_size), rows(k, head, 2), rows(v, head, 2)])
    assert torch.equal(ours[f"{layer}.self_attn.qkv_proj.weight"], want_qkv)
    gate, up = hf[f"{layer}.mlp.gate_up_proj.weight"].chunk(2)
    want_gate_up = torch.cat([rows(gate, rank, world_size), rows(up, rank, world_size)])
    assert torch.equal(ours[f"{layer}.mlp.gate_up_proj.weight"], want_gate_up)


@pytest.mark.parametrize(
    ("name", "shape", "message"),
    [
        ("model.layers.0.mlp.gate_up_proj.qweight", (8, 4), "only unquantized fused"),
        ("model.layers.0.mlp.gate_up_proj.weight", (7, 4), "7 outputs, expected 8"),
    ],
)
def test_fused_tensors_that_cannot_be_split_are_named(name, shape, message):
    fused = [FusedCheckpointModule("gate_up_proj", (("gate_proj", 4), ("up_proj", 4)))]
    with pytest.raises(ValueError, match=f"{name!r}: .*{message}"):
        list(split_fused_weights([(name, torch.zeros(shape))], fused))
