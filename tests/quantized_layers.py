"""What a quantized checkpoint's tests check of the model it loads into: each fused linear
layer holds its method and dequantizes to exactly the stacked weights of its checkpoint
parts (q, k, v; gate, up), which the test made by its own loops."""

from __future__ import annotations

import torch
from torch import nn

# A decoder layer's linear modules and the checkpoint modules each one stacks, in order.
FUSED_PARTS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o_proj": ("self_attn.o_proj",),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.down_proj",),
}


def assert_loads_dequantized(
    model: nn.Module, expected: dict[str, torch.Tensor], method: type
) -> list[nn.Module]:
    """Every decoder layer's linear modules run `method` and dequantize exactly to
    `expected` ({"model.layers.i.self_attn.q_proj": W, ...}) stacked; the modules checked."""
    checked = []
    for index, layer in enumerate(model.model.layers):
        for fused, parts in FUSED_PARTS.items():
            module = layer.get_submodule(fused)
            assert isinstance(module.linear_method, method), module.prefix
            want = torch.cat([expected[f"model.layers.{index}.{part}"] for part in parts])
            assert torch.equal(module.linear_method.dequantize(module), want), module.prefix
            checked.append(module)
    return checked
