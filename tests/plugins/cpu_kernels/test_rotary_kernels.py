"""The C++ core::rotary_embedding kernel against core's reference.

The kernel rounds where the reference rounds (cos / sin to the dtype, each product, the
sum) and uses no fused multiply-add, so it equals the reference bit for bit in every
dtype, float32 included; it writes only the query and key it is given, where they lie.
"""

from __future__ import annotations

import pytest
import torch

from core.models.layers import RotaryEmbedding
from core.ops import rotary_embedding_reference

ops = pytest.importorskip(
    "core_cpu_kernels.ops", reason="core-cpu-kernels is not installed (optional plugin)"
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
MAX_POSITIONS = 2048
# (query heads, KV heads, head size): SmolLM2's; MHA; the smallest head; one odd layout.
LAYOUTS = [(9, 3, 64), (4, 4, 16), (1, 1, 2), (3, 1, 128)]


def _tables(head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    rotary = RotaryEmbedding(head_size, MAX_POSITIONS, 10000.0)
    return rotary.cos_cache, rotary.sin_cache


def _fused_qkv(num_tokens, num_heads, num_kv_heads, head_size, dtype, seed=0):
    """A fused QKV output [T, (Hq + 2 Hkv) * D] and its query and key views."""
    gen = torch.Generator().manual_seed(seed)
    width = (num_heads + 2 * num_kv_heads) * head_size
    qkv = torch.randn(num_tokens, width, generator=gen).to(dtype)
    q_size, kv_size = num_heads * head_size, num_kv_heads * head_size
    query = qkv[:, :q_size].view(num_tokens, num_heads, head_size)
    key = qkv[:, q_size : q_size + kv_size].view(num_tokens, num_kv_heads, head_size)
    return qkv, query, key


def _positions(num_tokens: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, MAX_POSITIONS, (num_tokens,), generator=gen)


def _both(num_tokens, layout, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused QKV after the kernel and after the reference, from equal inputs."""
    positions, tables = _positions(num_tokens), _tables(layout[2])
    ours, query, key = _fused_qkv(num_tokens, *layout, dtype)
    ops.rotary_embedding(positions, query, key, *tables)
    theirs, query, key = _fused_qkv(num_tokens, *layout, dtype)
    rotary_embedding_reference(positions, query, key, *tables)
    return ours, theirs


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "h{}-kv{}-d{}".format(*layout))
@pytest.mark.parametrize("num_tokens", [1, 5, 64])
def test_the_fused_qkv_after_the_kernel_equals_it_after_the_reference(dtype, layout, num_tokens):
    ours, theirs = _both(num_tokens, layout, dtype)
    assert torch.equal(ours, theirs)  # values are not touched outside q and k either


def test_the_kernel_rotates_contiguous_query_and_key_too():
    gen = torch.Generator().manual_seed(0)
    query, key = torch.randn(3, 2, 8, generator=gen), torch.randn(3, 1, 8, generator=gen)
    want_query, want_key = query.clone(), key.clone()
    positions, tables = torch.tensor([0, 7, 3]), _tables(8)
    ops.rotary_embedding(positions, query, key, *tables)
    rotary_embedding_reference(positions, want_query, want_key, *tables)
    assert torch.equal(query, want_query) and torch.equal(key, want_key)


def test_a_position_outside_the_tables_is_refused_before_anything_is_written():
    qkv, query, key = _fused_qkv(3, 2, 1, 8, torch.float32)
    before = qkv.clone()
    with pytest.raises(RuntimeError, match="position 2048 is outside the rotary tables"):
        ops.rotary_embedding(torch.tensor([0, 1, MAX_POSITIONS]), query, key, *_tables(8))
    assert torch.equal(qkv, before)


def _untaken() -> dict[str, tuple]:
    """Inputs the kernel leaves to the reference: (positions, query, key, cos, sin)."""
    cos, sin = _tables(8)
    _, query, key = _fused_qkv(3, 2, 1, 8, torch.float32)
    _, query64, key64 = _fused_qkv(3, 2, 1, 8, torch.float64)
    _, query2, key2 = _fused_qkv(3, 2, 1, 16, torch.float32)  # every other element: D = 8
    positions = torch.tensor([4, 0, 9])
    return {
        "float64": (positions, query64, key64, cos, sin),
        "int32 positions": (positions.int(), query, key, cos, sin),
        "strided tables": (positions, query, key, cos.t().contiguous().t(), sin),
        "strided head dimension": (positions, query2[..., ::2], key2[..., ::2], cos, sin),
    }


@pytest.mark.parametrize("case", sorted(_untaken()))
def test_inputs_the_kernel_does_not_take_get_the_reference_exactly(case):
    ours, theirs = _untaken()[case], _untaken()[case]
    ops.rotary_embedding(*ours)
    rotary_embedding_reference(*theirs)
    assert torch.equal(ours[1], theirs[1]) and torch.equal(ours[2], theirs[2])
