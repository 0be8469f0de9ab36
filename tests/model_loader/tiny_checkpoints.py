"""Test helpers: tiny transformers models, and GGUF files written from them as llama.cpp would."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers

# HF parameter name (layer part) -> GGUF tensor name, from llama.cpp's tensor naming.
_LAYER_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GLOBAL_GGUF_NAMES = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
}

_MODEL_CLASSES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}


def gguf_name(hf_name: str) -> str:
    """The GGUF name llama.cpp gives the HF parameter `hf_name`."""
    stem, suffix = hf_name.rsplit(".", 1)
    if stem in _GLOBAL_GGUF_NAMES:
        return f"{_GLOBAL_GGUF_NAMES[stem]}.{suffix}"
    _, _, layer, rest = stem.split(".", 3)
    return f"blk.{layer}.{_LAYER_GGUF_NAMES[rest]}.{suffix}"


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf q/k permutation for llama (interleaves rotary halves)."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def tiny_model(arch: str, **overrides) -> transformers.PreTrainedModel:
    """A random 2-layer model: hidden 64, 4 heads, 2 kv heads, vocab 128."""
    config_class, model_class = _MODEL_CLASSES[arch]
    settings = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=50000.0,
        bos_token_id=1,
        eos_token_id=2,
    )
    settings.update(overrides)
    torch.manual_seed(0)
    model = model_class(config_class(**settings)).eval()
    with torch.no_grad():
        for param in model.parameters():  # norms start at 1 and biases at 0: make them distinct
            param.add_(torch.randn_like(param) * 0.1)
    return model


def expected_state_dict(model: transformers.PreTrainedModel) -> dict[str, torch.Tensor]:
    """The model's state dict without the tied lm_head (a GGUF stores it once)."""
    state = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    return state


def write_gguf_model(
    path: Path,
    model: transformers.PreTrainedModel,
    tensor_types: dict[str, gguf.GGMLQuantizationType] | None = None,
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """Write `model` as llama.cpp's converter would: metadata, GGUF names, permuted q/k.

    `tensor_types` maps GGUF names to the type to store them in (default F32); `extra`
    adds metadata or tensors.
    """
    config = model.config
    arch = config.model_type
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    if extra is not None:
        extra(writer)
    for hf_name, tensor in expected_state_dict(model).items():
        data = tensor.detach().numpy()
        if arch == "llama" and ".q_proj." in hf_name:
            data = llama_cpp_permute(data, config.num_attention_heads)
        elif arch == "llama" and ".k_proj." in hf_name:
            data = llama_cpp_permute(data, config.num_key_value_heads)
        _add_tensor(writer, gguf_name(hf_name), data, (tensor_types or {}).get(gguf_name(hf_name)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tensor(
    writer: gguf.GGUFWriter,
    name: str,
    data: np.ndarray,
    qtype: gguf.GGMLQuantizationType | None,
) -> None:
    if qtype is None:
        writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
    else:
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
