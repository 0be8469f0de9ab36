"""A GGUF header -> a transformers-style config.json dict."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from gguf import LlamaFileType

from core.model_loader.gguf_metadata import GGUFHeader

# GGUF `general.architecture` -> transformers class. Mistral checkpoints converted by
# llama.cpp carry the architecture "llama" and compute the same function as Llama.
ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

_FILE_DTYPES: dict[int, str] = {
    LlamaFileType.ALL_F32: "float32",
    LlamaFileType.MOSTLY_F16: "float16",
    LlamaFileType.MOSTLY_BF16: "bfloat16",
}

# The pre-training context of Llama 3, which llama.cpp's rope_freqs tensor assumes when
# the file does not say (only ratios of it matter; see _llama3_rope_scaling).
_LLAMA3_ORIGINAL_CONTEXT = 8192


def hf_config_from_gguf(header: GGUFHeader, rope_freqs: np.ndarray | None) -> dict[str, Any]:
    """Build the config.json dict of the model whose GGUF file has `header`.

    `rope_freqs` holds the values of the file's `rope_freqs.weight` tensor (llama.cpp's
    form of llama3 rope scaling), which the header does not carry; None when it has none.
    Dimensions come from the `{arch}.*` metadata; `head_dim` from
    `attention.key_length` (else `rope.dimension_count`, else hidden / heads);
    `vocab_size` from the embedding's rows; `tie_word_embeddings` from the absence of
    `output.weight`; `torch_dtype` from the file type (float32 for quantized files, whose
    dequantized values float32 holds exactly). Raises ValueError naming a missing or
    malformed key, or an architecture core cannot load.
    """
    metadata, tensors = header.metadata, header.tensors
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: {supported})")
    if "token_embd.weight" not in tensors:
        raise ValueError("GGUF file has no token_embd.weight tensor")
    hidden_size = _required_int(metadata, f"{arch}.embedding_length")
    num_heads = _required_int(metadata, f"{arch}.attention.head_count")
    head_dim = (
        _optional_int(metadata, f"{arch}.attention.key_length")
        or _optional_int(metadata, f"{arch}.rope.dimension_count")
        or hidden_size // num_heads
    )
    rope_theta = float(metadata.get(f"{arch}.rope.freq_base") or 10000.0)
    return {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden_size,
        "intermediate_size": _required_int(metadata, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _required_int(metadata, f"{arch}.block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": _optional_int(metadata, f"{arch}.attention.head_count_kv")
        or num_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _required_float(metadata, f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_theta": rope_theta,
        "rope_scaling": _rope_scaling(metadata, arch, rope_freqs, head_dim, rope_theta),
        "max_position_embeddings": _required_int(metadata, f"{arch}.context_length"),
        # GGUF `ne` lists the fastest dimension first: [hidden, vocab]
        "vocab_size": tensors["token_embd.weight"].shape[-1],
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "sliding_window": _optional_int(metadata, f"{arch}.attention.sliding_window"),
        "torch_dtype": _FILE_DTYPES.get(_optional_int(metadata, "general.file_type"), "float32"),
        "bos_token_id": _optional_int(metadata, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _optional_int(metadata, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _optional_int(metadata, "tokenizer.ggml.padding_token_id"),
    }


def _optional_int(metadata: Mapping[str, Any], key: str) -> int | None:
    value = metadata.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"GGUF metadata {key} should be an integer, got {value!r}")
    return value


def _required_int(metadata: Mapping[str, Any], key: str) -> int:
    value = _optional_int(metadata, key)
    if value is None:
        raise ValueError(f"GGUF metadata {key} is missing")
    return value


def _required_float(metadata: Mapping[str, Any], key: str) -> float:
    value = metadata.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"GGUF metadata {key} should be a number, got {value!r}")
    return float(value)


def _rope_scaling(
    metadata: Mapping[str, Any],
    arch: str,
    rope_freqs: np.ndarray | None,
    head_dim: int,
    rope_theta: float,
) -> dict[str, Any] | None:
    """The HF `rope_scaling` dict the metadata (or llama.cpp's rope_freqs tensor) describes."""
    original_context = _optional_int(metadata, f"{arch}.rope.scaling.original_context_length")
    if rope_freqs is not None:
        factors = np.asarray(rope_freqs, dtype=np.float64).reshape(-1)
        inv_freq = rope_theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        return _llama3_rope_scaling(factors, inv_freq, original_context or _LLAMA3_ORIGINAL_CONTEXT)
    kind = metadata.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind not in ("linear", "yarn"):
        raise ValueError(f"GGUF rope scaling type {kind!r} is not supported")
    scaling: dict[str, Any] = {
        "rope_type": kind,
        "factor": _required_float(metadata, f"{arch}.rope.scaling.factor"),
    }
    if original_context is not None:
        scaling["original_max_position_embeddings"] = original_context
    for suffix, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        if (value := metadata.get(f"{arch}.rope.scaling.{suffix}")) is not None:
            scaling[hf_key] = float(value)
    return scaling


def _llama3_rope_scaling(
    factors: np.ndarray, inv_freq: np.ndarray, original_context: int
) -> dict[str, Any] | None:
    """Recover HF's llama3 `rope_scaling` from llama.cpp's per-frequency divisors.

    llama.cpp stores, per rotary frequency, the divisor f the llama3 rule applies: 1 for
    wavelengths w below a/h, `factor` above a/l, and in between 1/f = (1-s)/factor + s with
    s = (a/w - l)/(h - l) (a: original context, l/h: low/high frequency factors). The
    divisors fix only a/(h-l) and l/(h-l), so `a` is given and l, h are fitted on the
    in-between frequencies; the fit is checked by recomputing every divisor.
    """
    factor = float(factors.max())
    if factor == 1.0:
        return None
    wavelen = 2 * math.pi / inv_freq
    between = (factors > 1 + 1e-6) & (factors < factor * (1 - 1e-6))
    if factors.shape != inv_freq.shape or between.sum() < 2:
        raise ValueError("GGUF rope_freqs tensor does not describe llama3 rope scaling")
    smooth = (1 / factors[between] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(1 / wavelen[between], smooth, 1)
    span = original_context / slope
    low = round(-intercept * span, 6)
    high = round(low + span, 6)
    smooth_all = np.clip((original_context / wavelen - low) / (high - low), 0, 1)
    if not np.allclose(1 / ((1 - smooth_all) / factor + smooth_all), factors, rtol=1e-4):
        raise ValueError("GGUF rope_freqs tensor does not describe llama3 rope scaling")
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original_context,
    }
