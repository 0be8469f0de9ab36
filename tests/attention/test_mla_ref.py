"""The reference MLA backend: latents written to the cache, prefill chunks (decompressed)
and decode rows (weights absorbed) both equal to attention over the heads' full keys and
values expanded from the latents, here in plain torch; and how MLA layers get it.

Expected outputs come from a per-query softmax written here, not from the backend.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.attention.backends.mla_ref import TorchRefMLABackend, TorchRefMLAImpl
from core.attention.backends.torch_ref import TorchRefBackend
from core.attention.interface import (
    AttentionCapabilities,
    AttentionRequirements,
    CommonAttentionMetadata,
    MLADims,
)
from core.attention.mla import MLAAttention
from core.attention.paged_metadata import PagedAttentionMetadataBuilder
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
    cache = torch.zeros(TorchRefMLABackend.get_kv_cache_shape(NUM_BLOCKS, BLOCK, 1, LATENT))
    order = torch.randperm(NUM_BLOCKS - 1, generator=generator) + 1  # block 0 is the null block
    tables, contexts, slots, starts = [], [], [], [0]
    for i, (cached, new) in enumerate(requests):
        blocks = order[4 * i : 4 * i + 4]  # room for 16 tokens
        latents = torch.randn(cached + new, LATENT, generator=generator)
        for pos in range(cached):
            cache[blocks[pos // BLOCK], pos % BLOCK] = latents[pos]
        slots += [int(blocks[p // BLOCK]) * BLOCK + p % BLOCK for p in range(cached, cached + new)]
        tables.append(blocks)
        contexts.append(latents)
        starts.append(starts[-1] + new)
    seq_lens = [cached + new for cached, new in requests]
    common = CommonAttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor([c for c, _ in requests], dtype=torch.int32),
        block_table=torch.stack(tables).int(),
        slot_mapping=torch.tensor(slots),
        num_reqs=len(requests),
        num_actual_tokens=starts[-1],
        max_query_len=max(new for _, new in requests),
        max_seq_len=max(seq_lens),
    )
    spec = MLAAttentionSpec(block_size=BLOCK, head_size=LATENT, dtype=torch.float32)
    metadata = PagedAttentionMetadataBuilder(spec, ["attn"], torch.device("cpu")).build(common)
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

    assert select_attention_backend(CpuPlatform(), mla).backend is TorchRefMLABackend
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
