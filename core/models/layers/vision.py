"""The building blocks the vision encoders share: their activations, their two-layer MLP and
attention confined to one image (or one window of one).

Plain PyTorch, replicated on every tensor-parallel rank: an encoder runs once per image,
outside the decoder's batch, and holds no KV cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

# transformers' ACT2FN entries the vision encoders and projectors use.
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "silu": F.silu,
}


def vision_activation(name: str, key: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation `name` that the config names under `key`; ValueError if unsupported."""
    if name not in _ACTIVATIONS:
        raise ValueError(
            f"config {key!r} {name!r} is not supported (one of {sorted(_ACTIVATIONS)})"
        )
    return _ACTIVATIONS[name]


class VisionMLP(nn.Module):
    """fc2(act(fc1(x))): the MLP of CLIP, SigLIP and Qwen2-VL's encoder layers."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        act: Callable[[torch.Tensor], torch.Tensor],
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size, dtype=dtype)
        self.act = act
        self.fc2 = nn.Linear(intermediate_size, hidden_size, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, hidden]
        return self.fc2(self.act(self.fc1(x)))


def attention_within(
    query: torch.Tensor,  # [N, H, D]
    key: torch.Tensor,  # [N, H, D]
    value: torch.Tensor,  # [N, H, D]
    seq_lens: Sequence[int],  # consecutive segments of the N tokens
) -> torch.Tensor:  # [N, H * D]
    """Softmax attention, scaled by D ** -0.5, of each token over every token of its
    segment and none outside it: the images of a batch (or the windows of one image) are
    packed back to back and must not see each other."""
    lens = list(seq_lens)
    outputs = [
        F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        for q, k, v in zip(query.split(lens), key.split(lens), value.split(lens), strict=True)
    ]  # each [H, n, D]
    return torch.cat([out.transpose(0, 1) for out in outputs]).flatten(1)
