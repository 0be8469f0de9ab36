"""The KV-cache dtype (--kv-cache-dtype): what the paged cache stores, and FP8's scales.

"auto" stores K/V in the model's dtype. "fp8_e4m3" and "fp8_e5m2" store one byte per
value (torch.float8_e4m3fn / float8_e5m2), half a 16-bit cache and a quarter of a float32
one, so the same KV budget holds twice (four times) the blocks. e4m3 keeps three mantissa
bits (range +-448) and is the format for K/V; e5m2 trades one of them for range. vLLM's
"fp8" is e4m3 (CacheConfig resolves it).

Each layer has two scales (`KVCacheScales`): the cache stores k / k_scale and v / v_scale,
and attention reads them back as stored * scale, computing in the model's dtype. They come
from the checkpoint where it has them (`kv_scale_target` names them) and are 1.0
otherwise, as in vLLM: SmolLM2-135M's keys stay within +-23 and its values within +-16
on held-out text, far inside e4m3's range, and its perplexity there moves by 0.3% with
1.0 (tests/attention/test_fp8_kv_cache.py), so a computed scale would buy nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "FP8_KV_CACHE_DTYPES",
    "KVCacheScales",
    "dequantize_kv",
    "kv_cache_torch_dtype",
    "kv_scale_target",
    "quantize_kv",
]

FP8_KV_CACHE_DTYPES: dict[str, torch.dtype] = {
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
"""The quantized --kv-cache-dtype names and the torch dtype each stores."""

# Checkpoint tensor names of the scales, after the attention module's prefix, as vLLM reads
# them: "<self_attn>.k_scale", "<self_attn>.attn.k_scale", and compressed-tensors'
# output scales of the key and value projections.
_SCALE_SUFFIXES = {
    "k_scale": "k_scale",
    "v_scale": "v_scale",
    "k_proj.output_scale": "k_scale",
    "v_proj.output_scale": "v_scale",
}
_ATTENTION_MODULE = "attn"  # what the models call their Attention layer's module


@dataclass(frozen=True)
class KVCacheScales:
    """One layer's scales for an FP8 cache: stored = k / k_scale, read = stored * k_scale
    (likewise v)."""

    k_scale: float = 1.0
    v_scale: float = 1.0


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the cache's tensors hold for a (resolved) --kv-cache-dtype."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in FP8_KV_CACHE_DTYPES:
        known = ["auto", *FP8_KV_CACHE_DTYPES]
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r} is not one of {known}")
    return FP8_KV_CACHE_DTYPES[kv_cache_dtype]


def quantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """`x` / `scale` in the FP8 `dtype`, computed in float32 (one rounding, whatever the
    model's dtype) and saturated at the format's largest value: a plain cast turns an
    outlier into inf (e5m2) or NaN (e4m3 on some devices), which attention would spread
    over the whole row."""
    finfo = torch.finfo(dtype)
    return (x.float() / scale).clamp_(finfo.min, finfo.max).to(dtype)


def dequantize_kv(stored: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """What attention reads from FP8 `stored`: stored * `scale` in the model's `dtype`."""
    return stored.to(dtype) * scale


def kv_scale_target(hf_name: str) -> tuple[str, str] | None:
    """(the Attention layer's module path, "k_scale" or "v_scale") when the checkpoint
    tensor `hf_name` is a KV-cache scale, else None.

    "model.layers.0.self_attn.k_scale", "...self_attn.attn.k_scale" and
    "...self_attn.k_proj.output_scale" all scale the keys of "model.layers.0.self_attn.attn".
    """
    for suffix, field in _SCALE_SUFFIXES.items():
        owner = hf_name.removesuffix(f".{suffix}")
        if owner != hf_name:
            if not owner.endswith(f".{_ATTENTION_MODULE}"):
                owner = f"{owner}.{_ATTENTION_MODULE}"
            return owner, field
    return None
