"""The AWQ algorithm on tensors: group-wise 4-bit rounding and the activation-aware scale.

AWQ (activation-aware weight quantization) multiplies input channel k of a weight W by
s[k] before rounding it to 4 bits and divides the layer's input by s[k] (folded into
the operation that produces it), so the function is unchanged but the channels that
carry large activations lose less to rounding. `search_scale` picks s as AutoAWQ does:
s = mean|x|^alpha over a grid of alpha, keeping the one whose quantized outputs are
closest to the exact ones on calibration inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "GROUP_SIZES",
    "GroupQuantized",
    "check_group_size",
    "fake_quantize",
    "quantize_groups",
    "search_scale",
]

GROUP_SIZES = (32, 64, 128)
MAX_Q = 15  # 4-bit codes 0..15
NUM_GRID = 20  # alphas 0, 1/20, ..., 19/20


@dataclass(frozen=True)
class GroupQuantized:
    """W [out, in] rounded to 4 bits in groups of `group_size` consecutive inputs.

    W[o, k] ~ (q[o, k] - zeros[o, k // G]) * scales[o, k // G].
    """

    q: torch.Tensor  # uint8 [out, in], 0..15
    zeros: torch.Tensor  # uint8 [out, in / G], 0..15
    scales: torch.Tensor  # float16 [out, in / G]

    @property
    def group_size(self) -> int:
        return self.q.shape[1] // self.scales.shape[1]

    def dequantize(self) -> torch.Tensor:  # [out, in] float32
        """The rounded W, exactly (q - zeros) * scales in float32."""
        zeros = self.zeros.float().repeat_interleave(self.group_size, dim=1)
        scales = self.scales.float().repeat_interleave(self.group_size, dim=1)
        return (self.q.float() - zeros) * scales


def quantize_groups(weight: torch.Tensor, group_size: int) -> GroupQuantized:
    """Asymmetric round-to-nearest of `weight` [out, in], AutoAWQ's `pseudo_quantize_tensor`.

    Per group of `group_size` inputs of one output: scale = (max - min) / 15 (at least
    1e-5 / 15), zero = clamp(-round(min / scale), 0, 15), q = clamp(round(w / scale) +
    zero, 0, 15). The scale is rounded to float16, the dtype the checkpoint stores it
    in, before the weights are rounded with it, so the stored values reproduce exactly
    the weights rounded here. ValueError naming group_size when it does not divide `in`.
    """
    levels, zeros, scales = _round_groups(weight, group_size)
    return GroupQuantized(
        q=(levels + zeros).reshape(weight.shape).to(torch.uint8),
        zeros=zeros.squeeze(-1).to(torch.uint8),
        scales=scales.squeeze(-1).half(),
    )


def fake_quantize(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """`quantize_groups(weight, group_size).dequantize()`, without the integer tensors."""
    levels, _, scales = _round_groups(weight, group_size)
    return levels.mul_(scales).reshape(weight.shape)


def _round_groups(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q - zeros [out, in / G, G], zeros [out, in / G, 1], scales [out, in / G, 1]), float32.

    clamp(round(w / s) + z, 0, 15) - z is computed as clamp(round(w / s), -z, 15 - z): the
    same integers in fewer passes over the weights (the search rounds thousands of times).
    """
    out_features, in_features = weight.shape
    check_group_size(group_size, in_features)
    groups = weight.float().reshape(out_features, in_features // group_size, group_size)
    low, high = torch.aminmax(groups, dim=-1, keepdim=True)
    scales = ((high - low).clamp_(min=1e-5) / MAX_Q).half().float()
    zeros = torch.round(low / scales).neg_().clamp_(0, MAX_Q)
    levels = torch.div(groups, scales).round_().clamp_(min=-zeros, max=MAX_Q - zeros)
    return levels, zeros, scales


def check_group_size(group_size: int, in_features: int) -> None:
    """ValueError naming group_size unless it is one of GROUP_SIZES and divides `in_features`."""
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size should be one of {GROUP_SIZES}, got {group_size!r}")
    if in_features % group_size:
        raise ValueError(f"group_size {group_size} does not divide in_features {in_features}")


def search_scale(x: torch.Tensor, weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """The per-input-channel scale s [in] AWQ chooses for `weight` [out, in] on inputs x [N, in].

    For alpha in 0, 1/20, ..., 19/20: s = mean|x|^alpha (clamped to >= 1e-4) normalized by
    sqrt(max(s) * min(s)); the loss is the mean squared difference between
    (x / s) @ Q(W * s)^T and x @ W^T, Q being `quantize_groups`. Returns the s of the
    lowest loss (alpha 0, s = 1, is plain round-to-nearest, so AWQ never does worse on x).
    """
    x = x.float()
    weight = weight.float()
    act_mean = x.abs().mean(dim=0)  # [in]
    best_loss, best_scale = float("inf"), torch.ones_like(act_mean)
    for step in range(NUM_GRID):
        scale = act_mean.pow(step / NUM_GRID).clamp(min=1e-4)
        scale = scale / (scale.max() * scale.min()).sqrt()
        scaled = weight * scale
        # (x / s) @ Q(W s)^T - x @ W^T = x @ ((Q(W s) - W s) / s)^T: one matmul per alpha.
        error = fake_quantize(scaled, group_size).sub_(scaled).div_(scale)  # [out, in]
        diff = (x @ error.T).view(-1)  # [N * out]
        loss = torch.dot(diff, diff).item() / diff.numel()
        if loss < best_loss:
            best_loss, best_scale = loss, scale
    return best_scale
