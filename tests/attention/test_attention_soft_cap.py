"""Attention-score soft-capping (Gemma 2): the reference backend against plain torch, and
the capability that keeps a backend without it from serving a soft-capping model."""

from __future__ import annotations

import importlib.metadata as metadata
import itertools

import pytest
import torch

from core.attention.backends.torch_ref import TorchRefBackend, TorchRefImpl
from core.attention.interface import (
    AttentionBackend,
    AttentionCapabilities,
    AttentionImpl,
    AttentionRequirements,
    CommonAttentionMetadata,
)
from core.attention.layer import Attention
from core.attention.paged_metadata import PagedAttentionMetadataBuilder
from core.attention.selector import select_attention_backend
from core.kv_cache.spec import FullAttentionSpec
from core.platforms.cpu import CpuPlatform
from core.plugins import PluginRegistry
from core.plugins.groups import ATTENTION_BACKENDS

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 4, 2, 8, 4
SCALE = HEAD_SIZE**-0.5
CAP = 1.0  # scores of these random tensors reach a few units: tanh bends them
BLOCK_TABLES = [[2, 7, 5], [6, 1, 3, 4]]  # per request, out of order
# Per step, the new tokens of each request: two fresh prefills; a decode beside a chunk on
# cached context; two decodes.
STEPS = [(6, 3), (1, 5), (1, 1)]


def plain_attention(
    query: torch.Tensor,  # [Q, Hq, D]: the last Q positions of the context
    key: torch.Tensor,  # [L, Hkv, D]: the whole context
    value: torch.Tensor,  # [L, Hkv, D]
    cap: float | None,
    window: int | None,
) -> torch.Tensor:  # [Q, Hq, D]
    """Causal (windowed) attention with scores c * tanh(s / c), spelled out."""
    num_queries, context = query.shape[0], key.shape[0]
    q_pos = torch.arange(context - num_queries, context)[:, None]
    k_pos = torch.arange(context)[None, :]
    visible = k_pos <= q_pos
    if window is not None:
        visible &= q_pos - k_pos < window
    group = NUM_HEADS // NUM_KV_HEADS
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", query, key) * SCALE
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, value)


def step_metadata(new: tuple[int, ...], computed: list[int]) -> CommonAttentionMetadata:
    seq_lens = [c + n for c, n in zip(computed, new, strict=True)]
    slots = [
        table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
        for table, start, end in zip(BLOCK_TABLES, computed, seq_lens, strict=True)
        for p in range(start, end)
    ]
    width = max(map(len, BLOCK_TABLES))
    return CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, *itertools.accumulate(new)], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor(computed, dtype=torch.int32),
        block_table=torch.tensor([t + [0] * (width - len(t)) for t in BLOCK_TABLES]).int(),
        slot_mapping=torch.tensor(slots),
        num_reqs=len(new),
        num_actual_tokens=sum(new),
        max_query_len=max(new),
        max_seq_len=max(seq_lens),
    )


@pytest.mark.parametrize("window", [None, 3])
def test_reference_soft_caps_prefill_chunks_and_decodes_like_plain_torch(window):
    impl = TorchRefImpl(NUM_HEADS, HEAD_SIZE, SCALE, NUM_KV_HEADS, window, logits_soft_cap=CAP)
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float32
    )
    builder = PagedAttentionMetadataBuilder(spec, ["layer"], torch.device("cpu"))
    kv_cache = torch.zeros(
        TorchRefBackend.get_kv_cache_shape(8, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    )
    generator = torch.Generator().manual_seed(0)
    keys: list[list[torch.Tensor]] = [[], []]
    values: list[list[torch.Tensor]] = [[], []]
    computed = [0, 0]
    for new in STEPS:
        q, k, v = (
            torch.randn(sum(new), heads, HEAD_SIZE, generator=generator) * 2
            for heads in (NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS)
        )
        out = impl.forward(q, k, v, kv_cache, builder.build(step_metadata(new, computed)))
        start = 0
        for r, count in enumerate(new):
            rows = slice(start, start + count)
            keys[r].append(k[rows])
            values[r].append(v[rows])
            context = torch.cat(keys[r]), torch.cat(values[r])
            want = plain_attention(q[rows], *context, CAP, window)
            torch.testing.assert_close(out[rows], want, atol=1e-5, rtol=1e-5)
            # The cap bites: without it the same attention differs.
            assert (plain_attention(q[rows], *context, None, window) - want).abs().max() > 1e-2
            start += count
        computed = [c + n for c, n in zip(computed, new, strict=True)]


class NoSoftCapImpl(AttentionImpl):
    """Takes no `logits_soft_cap`: a backend from before the capability existed."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads, sliding_window, attn_type):
        super().__init__(num_heads, head_size, scale, num_kv_heads, sliding_window, attn_type)

    def forward(self, query, key, value, kv_cache, attn_metadata):
        raise NotImplementedError


class NoSoftCapBackend(AttentionBackend):
    name = "no_soft_cap"
    capabilities = AttentionCapabilities(dtypes=frozenset({torch.float32}))
    get_builder_cls = staticmethod(lambda: PagedAttentionMetadataBuilder)
    get_kv_cache_shape = staticmethod(TorchRefBackend.get_kv_cache_shape)

    @staticmethod
    def get_impl_cls():
        return NoSoftCapImpl


class PrefersNoSoftCap(CpuPlatform):
    preferred_attention_backends = ("no_soft_cap", "torch_ref")


def requirements(soft_cap: bool) -> AttentionRequirements:
    return AttentionRequirements(torch.float32, 64, 16, logits_soft_cap=soft_cap)


@pytest.fixture
def registry() -> PluginRegistry:
    toy = metadata.EntryPoint("no_soft_cap", f"{__name__}:NoSoftCapBackend", ATTENTION_BACKENDS)
    return PluginRegistry([*metadata.entry_points(group=ATTENTION_BACKENDS), toy], None)


def test_capability_is_off_unless_declared_and_its_reason_names_it():
    assert NoSoftCapBackend.supports_combination(requirements(False)) is None
    reason = NoSoftCapBackend.supports_combination(requirements(True))
    assert reason == "attention logit soft-capping (logits_soft_cap) not supported"
    assert TorchRefBackend.supports_combination(requirements(True)) is None


def test_selector_passes_over_a_backend_that_cannot_soft_cap(registry):
    capped = select_attention_backend(PrefersNoSoftCap(), requirements(True), registry=registry)
    assert capped.name == "torch_ref"
    assert "soft-capping" in capped.rejected["no_soft_cap"]
    plain = select_attention_backend(PrefersNoSoftCap(), requirements(False), registry=registry)
    assert plain.name == "no_soft_cap"
    with pytest.raises(ValueError, match="'no_soft_cap' cannot serve .*logit soft-capping"):
        select_attention_backend(
            PrefersNoSoftCap(), requirements(True), forced="no_soft_cap", registry=registry
        )


def test_a_soft_capping_layer_refuses_a_backend_without_the_capability():
    layer = Attention("layers.0.attn", NUM_HEADS, HEAD_SIZE, SCALE, NUM_KV_HEADS,
                      logits_soft_cap=CAP)  # fmt: skip
    with pytest.raises(ValueError, match="'no_soft_cap' cannot serve logit soft-capping"):
        layer.bind_backend(NoSoftCapBackend)
    layer.bind_backend(TorchRefBackend)
    assert layer.impl.logits_soft_cap == CAP
    # A layer without a cap never passes the keyword, so older constructors still bind.
    Attention("layers.1.attn", NUM_HEADS, HEAD_SIZE, SCALE, NUM_KV_HEADS).bind_backend(
        NoSoftCapBackend
    )


def test_soft_cap_must_be_positive():
    with pytest.raises(ValueError, match="logits_soft_cap must be > 0"):
        Attention("layers.0.attn", NUM_HEADS, HEAD_SIZE, SCALE, NUM_KV_HEADS, logits_soft_cap=0.0)
