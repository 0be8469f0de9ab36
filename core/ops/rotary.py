"""Rotary position embedding as a kernel op, applied in place to queries and keys.

`core::rotary_embedding(positions, query, key, cos_cache, sin_cache)` rotates each
(i, i + D/2) pair of every head of `query` [T, Hq, D] and `key` [T, Hkv, D] by the angle
of its token's position (the "rotate half" / GPT-NeoX layout of HF Llama), writing the
result back into them. They are usually views into one fused QKV output (rows strided by
the QKV width; with partial rotary, the first D dimensions of heads that are wider, so
heads are strided by more than D), so a kernel must honour their strides. `cos_cache` /
`sin_cache` are the float32 [max_positions, D/2] tables of
`core.models.layers.RotaryEmbedding`.

The reference is transformers' arithmetic: cos and sin are cast to the query's dtype
first, then x * cos + rotate_half(x) * sin, each operation rounded to that dtype.
"""

from __future__ import annotations

import torch

from core.ops.registry import CORE_OPS
from core.ops.samples import Conformance, OpSample, Tolerance, randn

_SAMPLE_POSITIONS = 32

# The samples' values are below ~4 in magnitude. A kernel that computes in float32 and
# rounds once differs from the reference's three roundings by one unit in the last place
# of the output, or of a product where the two products cancel (the absolute term).
TOLERANCES = {
    torch.float32: Tolerance(rtol=1e-5, atol=1e-6),
    torch.bfloat16: Tolerance(
        rtol=torch.finfo(torch.bfloat16).eps, atol=2 * torch.finfo(torch.bfloat16).eps
    ),
    torch.float16: Tolerance(
        rtol=torch.finfo(torch.float16).eps, atol=2 * torch.finfo(torch.float16).eps
    ),
}


def apply_rotary_emb(
    x: torch.Tensor,  # [T, num_heads, head_dim]
    cos: torch.Tensor,  # [T, 1, head_dim]
    sin: torch.Tensor,  # [T, 1, head_dim]
) -> torch.Tensor:  # [T, num_heads, head_dim]
    """Rotate each (i, i + head_dim/2) pair of `x` by its position's angle (a new tensor).

    cos/sin are cast to x's dtype first, as transformers does, so low-precision models
    round where the reference does.
    """
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def rotary_embedding_reference(
    positions: torch.Tensor,  # [T] int64
    query: torch.Tensor,  # [T, Hq, D], written in place
    key: torch.Tensor,  # [T, Hkv, D], written in place
    cos_cache: torch.Tensor,  # [max_positions, D / 2] float32
    sin_cache: torch.Tensor,  # [max_positions, D / 2] float32
) -> None:
    """Rotate query and key in place by the angles of `positions` (apply_rotary_emb)."""
    cos, sin = cos_cache[positions], sin_cache[positions]  # [T, D / 2]
    cos = torch.cat((cos, cos), -1).unsqueeze(1)  # [T, 1, D]
    sin = torch.cat((sin, sin), -1).unsqueeze(1)
    query.copy_(apply_rotary_emb(query, cos, sin))
    key.copy_(apply_rotary_emb(key, cos, sin))


def _rotary_embedding_fake(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
) -> None:
    return None


def _tables(head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin [_SAMPLE_POSITIONS, head_dim / 2] of the default rope (theta 10000)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    angles = torch.outer(torch.arange(_SAMPLE_POSITIONS, dtype=torch.float32), 10000.0**-exponents)
    return angles.cos().to(device), angles.sin().to(device)


def _rotary_embedding_samples(dtype: torch.dtype, device: torch.device) -> list[OpSample]:
    def sample(name, positions, query, key) -> OpSample:
        tables = _tables(query.shape[-1], device)
        return OpSample(name, (torch.tensor(positions, device=device), query, key, *tables))

    def qkv_views(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int):
        width = (num_heads + 2 * num_kv_heads) * head_dim  # [T, (Hq + 2 Hkv) * D]
        qkv = randn((num_tokens, width), dtype, device, seed=0)
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        query = qkv[:, :q_size].view(num_tokens, num_heads, head_dim)
        key = qkv[:, q_size : q_size + kv_size].view(num_tokens, num_kv_heads, head_dim)
        return query, key

    def dense(shape_q: tuple[int, int, int], shape_k: tuple[int, int, int]):
        return randn(shape_q, dtype, device, seed=0), randn(shape_k, dtype, device, seed=1)

    return [
        sample("one token, views into a fused QKV", [17], *qkv_views(1, 9, 3, 64)),
        sample("packed requests, views into a fused QKV", [7, 0, 1, 31], *qkv_views(4, 4, 2, 16)),
        sample("head size 2, contiguous q and k", [0, 3, 5], *dense((3, 2, 2), (3, 1, 2))),
        sample("odd head counts", [1, 2], *dense((2, 3, 8), (2, 1, 8))),
        sample(
            "partial rotary: 8 of each 16-wide head",
            [3, 30, 4],
            *(t[..., :8] for t in qkv_views(3, 4, 2, 16)),
        ),
    ]


ROTARY_EMBEDDING = CORE_OPS.declare(
    "rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!) key, Tensor cos_cache, "
    "Tensor sin_cache) -> ()",
    rotary_embedding_reference,
    _rotary_embedding_fake,
    Conformance(_rotary_embedding_samples, TOLERANCES),
)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
) -> None:
    """`core::rotary_embedding` through the kernel serving the positions' device type."""
    ROTARY_EMBEDDING(positions, query, key, cos_cache, sin_cache)
