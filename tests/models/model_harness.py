"""Test helpers: tiny random transformers models, and a dense attention to run ours with.

The paged backend and the model runner are not needed to check the model code: the
`DenseAttentionBackend` here attends over one sequence, ignoring the KV cache, which is
exactly what transformers computes for a single prompt.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers
from torch import nn

from core.attention.interface import AttentionBackend, AttentionCapabilities, AttentionImpl
from core.forward_context import ForwardContext, set_forward_context
from core.models import ArchConfig, iter_attention_layers
from core.models.llama import LlamaForCausalLM
from core.models.mistral import MistralForCausalLM
from core.models.mixtral import MixtralForCausalLM
from core.models.olmoe import OlmoeForCausalLM
from core.models.phi3 import Phi3ForCausalLM
from core.models.qwen2 import Qwen2ForCausalLM
from core.models.qwen3 import Qwen3ForCausalLM
from core.models.qwen_moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM

# architecture -> (transformers config class, transformers model class, our class)
ARCHITECTURES = {
    "LlamaForCausalLM": (transformers.LlamaConfig, transformers.LlamaForCausalLM, LlamaForCausalLM),
    "MistralForCausalLM": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        MistralForCausalLM,
    ),
    "Qwen2ForCausalLM": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, Qwen2ForCausalLM),
    "Qwen3ForCausalLM": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, Qwen3ForCausalLM),
    "MixtralForCausalLM": (
        transformers.MixtralConfig,
        transformers.MixtralForCausalLM,
        MixtralForCausalLM,
    ),
    "Qwen2MoeForCausalLM": (
        transformers.Qwen2MoeConfig,
        transformers.Qwen2MoeForCausalLM,
        Qwen2MoeForCausalLM,
    ),
    "Qwen3MoeForCausalLM": (
        transformers.Qwen3MoeConfig,
        transformers.Qwen3MoeForCausalLM,
        Qwen3MoeForCausalLM,
    ),
    "OlmoeForCausalLM": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM, OlmoeForCausalLM),
    "Phi3ForCausalLM": (transformers.Phi3Config, transformers.Phi3ForCausalLM, Phi3ForCausalLM),
}

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    initializer_range=0.1,  # large enough that attention is far from uniform
)


def tiny_hf_model(architecture: str, **overrides) -> transformers.PreTrainedModel:
    """A random 2-layer transformers model (eager attention), every parameter distinct."""
    config_class, model_class, _ = ARCHITECTURES[architecture]
    settings = {**TINY, "architectures": [architecture], **overrides}
    config = config_class(**settings)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for param in model.parameters():  # norms start at 1 and biases at 0: make them distinct
            param.add_(torch.randn_like(param) * 0.1)
    return model


def our_model(
    hf_model: transformers.PreTrainedModel, quant_config=None, dtype=torch.float32
) -> LlamaForCausalLM:
    """Our model of the same architecture, loaded with `hf_model`'s state dict."""
    config = ArchConfig.from_hf(hf_model.config.to_dict())
    model = ARCHITECTURES[config.architectures[0]][2](config, quant_config, dtype)
    model.load_weights(hf_model.state_dict().items())
    return model


class DenseCausalImpl(AttentionImpl):
    """Causal attention within one sequence (the whole of `query`), with GQA and window."""

    def forward(self, query, key, value, kv_cache, attn_metadata):
        # query: [T, H, D]; key, value: [T, H_kv, D]
        group = self.num_heads // self.num_kv_heads
        key = key.repeat_interleave(group, dim=1)  # [T, H, D], query head h reads kv h // group
        value = value.repeat_interleave(group, dim=1)
        pos = torch.arange(query.shape[0])
        allowed = pos[:, None] >= pos[None, :]  # [T, T]
        if self.sliding_window is not None:
            allowed &= pos[:, None] - pos[None, :] < self.sliding_window
        out = F.scaled_dot_product_attention(
            query.transpose(0, 1),
            key.transpose(0, 1),
            value.transpose(0, 1),
            attn_mask=allowed,
            scale=self.scale,
        )  # [H, T, D]
        return out.transpose(0, 1)


class DenseAttentionBackend(AttentionBackend):
    """Only the impl is used: these tests build no metadata and allocate no cache."""

    name = "test-dense"
    capabilities = AttentionCapabilities(dtypes=frozenset({torch.float32, torch.bfloat16}))

    @staticmethod
    def get_impl_cls():
        return DenseCausalImpl


def run_logits(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits [T, vocab] of one sequence `input_ids` [T] at positions 0..T-1."""
    layers = list(iter_attention_layers(model))
    for layer in layers:
        layer.bind_backend(DenseAttentionBackend)
        layer.kv_cache = torch.empty(0)
    num_tokens = input_ids.shape[0]
    context = ForwardContext({layer.layer_name: None for layer in layers}, num_tokens)
    with torch.inference_mode(), set_forward_context(context):
        hidden = model(input_ids, torch.arange(num_tokens))
        return model.compute_logits(hidden)


def hf_logits(hf_model: transformers.PreTrainedModel, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model(input_ids[None]).logits[0]  # [T, vocab]


def assert_logits_match(got: torch.Tensor, want: torch.Tensor) -> None:
    """The parity rule: max abs difference within 1e-4 of the logit scale (max |logit|)."""
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    assert diff <= 1e-4 * scale, f"max |diff| {diff:.3g} > 1e-4 x max |logit| {scale:.3g}"
