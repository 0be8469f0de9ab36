"""FP8 KV caches for the attention kernels' tests, holding what the reference's forward
stores: K / k_scale and V / v_scale in the cache's format (core.attention.kv_cache_dtype)."""

from __future__ import annotations

import torch

from core.attention.kv_cache_dtype import FP8_KV_CACHE_DTYPES, KVCacheScales, quantize_kv

FP8 = sorted(FP8_KV_CACHE_DTYPES)  # the --kv-cache-dtype names
# No powers of two: every value read back is a rounded product, as in the reference.
SCALES = KVCacheScales(k_scale=0.37, v_scale=3.1)


def store_fp8(cache: torch.Tensor, scales: KVCacheScales, seed: int = 3) -> torch.Tensor:
    """Fill `cache` (FP8, keys then values on dimension 1) with random K and V of magnitudes
    1e-4 to 126 quantized with `scales`: subnormals of both formats, normals, and e4m3's
    top binade once divided by k_scale. Returns the cache."""
    generator = torch.Generator().manual_seed(seed)
    for kv, scale in enumerate((scales.k_scale, scales.v_scale)):
        shape = cache[:, kv].shape
        magnitudes = 10 ** torch.empty(shape).uniform_(-4, 1.5, generator=generator)
        values = torch.randn(shape, generator=generator).clamp(-4, 4) * magnitudes
        cache[:, kv] = quantize_kv(values, scale, cache.dtype)
    return cache


def finite_values(dtype: torch.dtype, size: int) -> torch.Tensor:
    """Every finite value of the FP8 `dtype` (each of its bytes but NaNs and infinities),
    then zeros up to `size` values."""
    values = torch.arange(256, dtype=torch.uint8).view(dtype)
    finite = values[values.float().isfinite()]
    return torch.cat([finite, torch.zeros(size - len(finite), dtype=dtype)])
