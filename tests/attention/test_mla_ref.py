"""The reference MLA backend: latents written to the cache, prefill chunks (decompressed)
and decode rows (weights absorbed) both equal to attention over the heads' full keys and
values expanded from the latents, here in plain torch; and how MLA layers get it.

Expected outputs come from a per-query softmax written here, not from the backend.
"""

from __future__ import annotations

import pytest
import torch
from paged_steps import paged_step
from torch import nn

from core.attention.backends.mla_ref import TorchRefMLABackend, TorchRefMLAImpl
from core.attention.backends.torch_ref import TorchRefBackend
from core.attention.interface import (
    AttentionCapabilities,
    AttentionRequirements,
    MLADims,
)
from core.attention.mla import MLAAttention
from core.attention.selector import select_attention_backend
from core.kv_cache.spec import MLAAttentionSpec
from core.platforms.cpu import CpuPlatform

DIMS = MLADims(kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=5)
LATENT, HEADS, BLOCK, NUM_BLOCKS = DIMS.latent_size, 3, 4, 24
SCALE = 0.7
# (cached tokens, new tokens) per request: a fresh prompt, a chunk after cached context,
# a one-token chunk, decodes ending mid-block and on a block edge.
REQUESTS = [(0, 5), (6, 3), (8, 1), (9, 1), (15, 1)]
DECODES = [(8, 1), (3, 1), (15, 1)]


def expanded_attention(
    q: torch.Tensor, latents: torch.Tensor, kv_b: torch.Tensor
) -> torch.Tensor:  # q: [n, H, Dn + Dr] at the last n positions of latents [seq_len, L]
    """Every head's keys and values expanded from the latents, one softmax per query."""
    kv_c, k_pe = latents.split([DIMS.kv_lora_rank, DIMS.qk_rope_head_dim], dim=-1)
    kv = (kv_c @ kv_b.T).view(len(latents), HEADS, -1)  # [seq_len, H, Dn + Dv]
    k_nope, v = kv.split([DIMS.qk_nope_head_dim, DIMS.v_head_dim], dim=-1)
    out = torch.empty(q.shape[0], HEADS, DIMS.v_head_dim)
    for i in range(q.shape[0]):
        pos = len(latents) - q.shape[0] + i
        for h in range(HEADS):
            keys = torch.cat((k_nope[: pos + 1, h], k_pe[: pos + 1]), dim=-1)
            weights = torch.softmax(keys @ q[i, h] * SCALE, dim=0)
            out[i, h] = weights @ v[: pos + 1, h]
    return out


def step(generator: torch.Generator, requests: list[tuple[int, int]]):
    """A cache holding each request's cached latents, the step's metadata, its queries,
    its new latents, and each request's whole context of latents."""
    spec = MLAAttentionSpec(block_size=BLOCK, head_size=LATENT, dtype=torch.float32)
    tables, starts, metadata = paged_step(generator, requests, spec, NUM_BLOCKS)
    cache = torch.zeros(TorchRefMLABackend.get_kv_cache_shape(NUM_BLOCKS, BLOCK, 1, LATENT))
    contexts = []
    for blocks, (cached, new) in zip(tables, requests, strict=True):
        latents = torch.randn(cached + new, LATENT, generator=generator)
        for pos in range(cached):
            cache[blocks[pos // BLOCK], pos % BLOCK] = latents[pos]
        contexts.append(latents)
    query = torch.randn(starts[-1], HEADS, DIMS.qk_nope_head_dim + DIMS.qk_rope_head_dim,
                        generator=generator)  # fmt: skip
    new_latents = torch.cat([ctx[c:] for ctx, (c, _) in zip(contexts, requests, strict=True)])
    return cache, metadata, query, new_latents, contexts, starts


def impl(kv_b_proj: nn.Module) -> TorchRefMLAImpl:
    return TorchRefMLAImpl(HEADS, LATENT, SCALE, 1, mla=DIMS, kv_b_proj=kv_b_proj)


class WeightOnly(nn.Module):
    """kv_b_proj's weight without its forward: absorbed attention never expands latents."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("decode rows expanded the latents through kv_b_proj")


@pytest.mark.parametrize(
    ("requests", "kv_b_module"),
    [(REQUESTS, "linear"), (DECODES, "weight_only")],
    ids=["prefill_chunks_and_decodes", "decodes_absorbed"],
)
def test_forward_equals_attention_over_expanded_keys_and_values(requests, kv_b_module):
    generator = torch.Generator().manual_seed(0)
    kv_b = torch.randn(HEADS * (DIMS.qk_nope_head_dim + DIMS.v_head_dim), DIMS.kv_lora_rank,
                       generator=generator)  # fmt: skip
    if kv_b_module == "linear":
        kv_b_proj = nn.Linear(DIMS.kv_lora_rank, kv_b.shape[0], bias=False)
        kv_b_proj.weight.data.copy_(kv_b)
    else:
        kv_b_proj = WeightOnly(kv_b)
    cache, metadata, query, new_latents, contexts, starts = step(generator, requests)
    key = new_latents[:, None, :]  # [T, 1, L]

    with torch.no_grad():
        out = impl(kv_b_proj).forward(query, key, key[..., : DIMS.kv_lora_rank], cache, metadata)

    for i, latents in enumerate(contexts):
        rows = slice(starts[i], starts[i + 1])
        torch.testing.assert_close(out[rows], expanded_attention(query[rows], latents, kv_b))
    slots = metadata.slot_mapping
    assert torch.equal(cache.view(-1, LATENT)[slots], new_latents)  # the step's latents stored


def test_mla_requirements_get_the_reference_family_mla_backend():
    mla = AttentionRequirements(torch.float32, LATENT, BLOCK, use_mla=True)
    plain = AttentionRequirements(torch.float32, LATENT, BLOCK)

    choice = select_attention_backend(CpuPlatform(), mla, forced="torch_ref")
    assert choice.backend is TorchRefMLABackend
    assert TorchRefBackend.mla_backend is TorchRefMLABackend
    assert TorchRefMLABackend.supports_combination(plain) == (
        "serves only multi-head latent attention (MLA) layers"
    )
    no_mla = AttentionCapabilities(dtypes=frozenset({torch.float32}))
    assert no_mla.check(mla) == "serves no multi-head latent attention (MLA) layers"


def test_mla_layer_caches_one_latent_and_refuses_other_backends():
    layer = MLAAttention("attn", HEADS, SCALE, DIMS, nn.Linear(DIMS.kv_lora_rank, 27, bias=False))

    assert layer.kv_cache_spec(BLOCK, torch.float32).page_size_bytes == BLOCK * LATENT * 4
    with pytest.raises(ValueError, match="'torch_ref' cannot serve multi-head latent attention"):
        layer.bind_backend(TorchRefBackend)
    layer.bind_backend(TorchRefMLABackend)
    assert isinstance(layer.impl, TorchRefMLAImpl)


class RecordingDecode(TorchRefMLAImpl):
    """Overrides only the public decode hook, as a kernel plugin does."""

    def __init__(self, kv_b_proj: nn.Module, result: torch.Tensor) -> None:
        super().__init__(HEADS, LATENT, SCALE, 1, mla=DIMS, kv_b_proj=kv_b_proj)
        self.result = result
        self.queries: list[torch.Tensor] = []

    def forward_decode(self, query, kv_cache, decode):
        self.queries.append(query.clone())
        return self.result


def test_the_decode_hook_gets_absorbed_queries_and_its_result_goes_through_w_uv():
    generator = torch.Generator().manual_seed(1)
    nope, rope, rank = DIMS.qk_nope_head_dim, DIMS.qk_rope_head_dim, DIMS.kv_lora_rank
    kv_b = torch.randn(HEADS * (nope + DIMS.v_head_dim), rank, generator=generator)
    cache, metadata, query, new_latents, _, _ = step(generator, DECODES)
    latent_out = torch.randn(len(DECODES), HEADS, rank, generator=generator)
    impl = RecordingDecode(WeightOnly(kv_b), latent_out)
    key = new_latents[:, None, :]

    with torch.no_grad():
        out = impl.forward(query, key, key[..., :rank], cache, metadata)

    (seen,) = impl.queries  # one call, with every decode row (the whole step)
    per_head = kv_b.view(HEADS, nope + DIMS.v_head_dim, rank)
    for h in range(HEADS):
        w_uk, w_uv = per_head[h, :nope], per_head[h, nope:]  # [Dn, R], [Dv, R]
        q_nope, q_pe = query[:, h, :nope], query[:, h, nope:]
        assert q_pe.shape[-1] == rope
        torch.testing.assert_close(seen[:, h], torch.cat((q_nope @ w_uk, q_pe), dim=-1))
        torch.testing.assert_close(out[:, h], latent_out[:, h] @ w_uv.T)
