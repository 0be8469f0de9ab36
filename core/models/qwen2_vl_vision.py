"""The vision transformer of Qwen2-VL and Qwen2.5-VL.

An image comes as its patches ([num_patches, C * T * P * P], T the temporal patch: a still
image is repeated T times), in the order Qwen2VLImageProcessor emits them: each 2x2 block
of neighbouring patches (`spatial_merge_size`) consecutive, so the final merger folds
every block into one embedding by a reshape. Attention stays within one image, with a 2-D
rotary embedding of each patch's (row, column). Qwen2.5-VL adds RMSNorm, a gated SiLU MLP
and window attention: blocks other than `fullatt_block_indexes` attend within windows of
`window_size` pixels, for which the merge blocks are reordered window by window and put
back after the merger.

Module names are transformers' (Qwen2VisionTransformerPretrainedModel), so checkpoint
tensors load by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.models.layers import RMSNorm
from core.models.layers.vision import VisionMLP, attention_within, vision_activation
from core.ops.rotary import apply_rotary_emb

_NORM_EPS = 1e-6
Grid = tuple[int, int, int]  # an image's patches: (temporal, rows, columns)


@dataclass(frozen=True)
class Qwen2VisionConfig:
    """`vision_config` of a Qwen2-VL (`qwen2_5` False) or Qwen2.5-VL config.json.

    `window_size` is None for Qwen2-VL, whose blocks all attend to the whole image (none
    is listed in `fullatt_block_indexes`: there are no windows to leave)."""

    qwen2_5: bool
    width: int  # the encoder's hidden size (Qwen2-VL: embed_dim)
    out_hidden_size: int  # the decoder's hidden size, the merger's output
    intermediate_size: int
    depth: int
    num_heads: int
    hidden_act: str
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    rope_theta: float
    window_size: int | None
    fullatt_block_indexes: tuple[int, ...]

    @classmethod
    def from_hf(cls, d: dict[str, Any], qwen2_5: bool) -> Qwen2VisionConfig:
        """Qwen2-VL names the width `embed_dim` and the output `hidden_size`; Qwen2.5-VL
        `hidden_size` and `out_hidden_size`. ValueError naming a missing key."""
        width = int(_required(d, "hidden_size" if qwen2_5 else "embed_dim"))
        rope = d.get("rope_parameters") or {}
        return cls(
            qwen2_5=qwen2_5,
            width=width,
            out_hidden_size=int(_required(d, "out_hidden_size" if qwen2_5 else "hidden_size")),
            intermediate_size=int(
                _required(d, "intermediate_size") if qwen2_5 else width * d.get("mlp_ratio", 4)
            ),
            depth=int(_required(d, "depth")),
            num_heads=int(_required(d, "num_heads")),
            hidden_act=d.get("hidden_act", "silu" if qwen2_5 else "quick_gelu"),
            in_channels=int(d.get("in_channels") or d.get("in_chans") or 3),
            patch_size=int(d.get("patch_size", 14)),
            temporal_patch_size=int(d.get("temporal_patch_size", 2)),
            spatial_merge_size=int(d.get("spatial_merge_size", 2)),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            window_size=int(d.get("window_size", 112)) if qwen2_5 else None,
            fullatt_block_indexes=(
                tuple(d.get("fullatt_block_indexes", (7, 15, 23, 31))) if qwen2_5 else ()
            ),
        )

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads


class _PatchEmbed(nn.Module):
    def __init__(self, config: Qwen2VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.patch_shape = (
            config.in_channels, config.temporal_patch_size, config.patch_size, config.patch_size
        )  # fmt: skip
        kernel = self.patch_shape[1:]
        self.proj = nn.Conv3d(
            config.in_channels, config.width, kernel, kernel, bias=False, dtype=dtype
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:  # [N, C*T*P*P] -> [N, W]
        patches = pixel_values.view(-1, *self.patch_shape)  # [N, C, T, P, P]
        return self.proj(patches).view(patches.shape[0], -1)


class _Attention(nn.Module):
    def __init__(self, config: Qwen2VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.width, 3 * config.width, dtype=dtype)
        self.proj = nn.Linear(config.width, config.width, dtype=dtype)

    def forward(
        self,
        x: torch.Tensor,  # [N, W]
        cos: torch.Tensor,  # [N, 1, D] float32
        sin: torch.Tensor,  # [N, 1, D] float32
        seq_lens: Sequence[int],
    ) -> torch.Tensor:  # [N, W]
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.num_heads, -1).unbind(1)  # [N, H, D]
        # Rotated in float32, as transformers does for the encoder.
        q, k = (apply_rotary_emb(t.float(), cos, sin).to(t.dtype) for t in (q, k))
        return self.proj(attention_within(q, k, v, seq_lens))


class _GatedMLP(nn.Module):
    """Qwen2.5-VL's MLP: down(act(gate(x)) * up(x)), every projection biased."""

    def __init__(self, config: Qwen2VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        width, inter = config.width, config.intermediate_size
        self.gate_proj = nn.Linear(width, inter, dtype=dtype)
        self.up_proj = nn.Linear(width, inter, dtype=dtype)
        self.down_proj = nn.Linear(inter, width, dtype=dtype)
        self.act = vision_activation(config.hidden_act, "vision_config.hidden_act")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, W] -> [N, W]
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class _Block(nn.Module):
    def __init__(self, config: Qwen2VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm1, self.norm2 = (_norm(config, config.width, dtype) for _ in range(2))
        self.attn = _Attention(config, dtype)
        self.mlp: nn.Module = (
            _GatedMLP(config, dtype)
            if config.qwen2_5
            else VisionMLP(
                config.width,
                config.intermediate_size,
                vision_activation(config.hidden_act, "vision_config.hidden_act"),
                dtype,
            )
        )

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seq_lens: Sequence[int]
    ) -> torch.Tensor:  # [N, W]
        x = x + self.attn(self.norm1(x), cos, sin, seq_lens)
        return x + self.mlp(self.norm2(x))


class _PatchMerger(nn.Module):
    """Each block of merge_size**2 consecutive patches, normalized and concatenated, through
    an MLP into one embedding of the decoder's size."""

    def __init__(self, config: Qwen2VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        merged = config.width * config.spatial_merge_size**2
        self.ln_q = _norm(config, config.width, dtype)
        self.mlp = nn.Sequential(
            nn.Linear(merged, merged, dtype=dtype),
            nn.GELU(),
            nn.Linear(merged, config.out_hidden_size, dtype=dtype),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, W] -> [N / merge**2, out]
        return self.mlp(self.ln_q(x).view(-1, self.mlp[0].in_features))


class Qwen2VisionTransformer(nn.Module):
    """Images' patches in, one embedding per merge block out (images back to back)."""

    def __init__(self, config: Qwen2VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = _PatchEmbed(config, dtype)
        self.blocks = nn.ModuleList(_Block(config, dtype) for _ in range(config.depth))
        self.merger = _PatchMerger(config, dtype)
        # The rotary frequencies of one axis: a quarter of each head's dimensions turns by
        # the row, a quarter by the column (the other half pairs with them).
        axis_dim = config.head_dim // 2
        exponents = torch.arange(0, axis_dim, 2, dtype=torch.float32) / axis_dim
        self.register_buffer("inv_freq", 1.0 / config.rope_theta**exponents, persistent=False)

    def forward(
        self,
        pixel_values: torch.Tensor,  # [N, C*T*P*P], the images' patches back to back
        grids: Sequence[Grid],  # each image's (t, h, w) in patches
    ) -> torch.Tensor:  # [N / merge**2, out_hidden_size]
        hidden = self.patch_embed(pixel_values)  # [N, W]
        angles = self._rotary_angles(grids)  # [N, D / 2]
        angles = torch.cat((angles, angles), dim=-1).unsqueeze(1)  # [N, 1, D]
        cos, sin = angles.cos(), angles.sin()
        image_lens = [h * w for t, h, w in grids for _ in range(t)]  # one frame each
        window_lens, order = image_lens, None
        if self.config.window_size is not None:
            order, window_lens = self._window_order(grids)
            hidden, cos, sin = (self._by_merge_block(x, order) for x in (hidden, cos, sin))
        full_blocks = self.config.fullatt_block_indexes
        for i, block in enumerate(self.blocks):
            hidden = block(hidden, cos, sin, image_lens if i in full_blocks else window_lens)
        merged = self.merger(hidden)
        return merged if order is None else merged[torch.argsort(order)]

    def _rotary_angles(self, grids: Sequence[Grid]) -> torch.Tensor:  # [N, D / 2]
        """Each patch's rotary angles: its row's, then its column's, the patches in the
        processor's order (merge blocks consecutive)."""
        merge = self.config.spatial_merge_size
        positions = []
        for t, h, w in grids:
            rows = torch.arange(h).view(h, 1).expand(h, w)
            cols = torch.arange(w).view(1, w).expand(h, w)
            blocks = (h // merge, merge, w // merge, merge)
            rows, cols = (x.reshape(blocks).transpose(1, 2).flatten() for x in (rows, cols))
            positions.append(torch.stack((rows, cols), dim=-1).repeat(t, 1))  # [t*h*w, 2]
        position = torch.cat(positions).to(self.inv_freq.device)  # [N, 2]
        return (position[..., None] * self.inv_freq).flatten(1)  # [N, 2, D / 4] -> [N, D / 2]

    def _window_order(self, grids: Sequence[Grid]) -> tuple[torch.Tensor, list[int]]:
        """Qwen2.5-VL's windows: the merge blocks' order window by window (each image's
        grid of blocks cut into squares of window_size / merge / patch blocks a side, the
        last ones cut short at the edges) and each window's length in patches."""
        merge, config = self.config.spatial_merge_size, self.config
        side = config.window_size // merge // config.patch_size  # merge blocks a window side
        order, lens, offset = [], [], 0
        for t, h, w in grids:
            rows, cols = h // merge, w // merge
            index = torch.arange(t * rows * cols).view(t, rows, cols)
            index = F.pad(index, (0, -cols % side, 0, -rows % side), value=-1)
            across, down = index.shape[2] // side, index.shape[1] // side
            windows = index.view(t, down, side, across, side).permute(0, 1, 3, 2, 4)
            windows = windows.reshape(-1, side * side)  # [windows, blocks], -1 past the edge
            kept = windows >= 0
            order.append(windows[kept] + offset)
            lens.extend((kept.sum(-1) * merge**2).tolist())
            offset += t * rows * cols
        return torch.cat(order).to(self.inv_freq.device), lens

    def _by_merge_block(self, x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """`x` [N, ...] with its merge blocks of consecutive rows in `order`."""
        block = self.config.spatial_merge_size**2
        return x.view(-1, block, *x.shape[1:])[order].flatten(0, 1)


def _norm(config: Qwen2VisionConfig, size: int, dtype: torch.dtype) -> nn.Module:
    """Qwen2.5-VL's RMSNorm, Qwen2-VL's LayerNorm."""
    if config.qwen2_5:
        return RMSNorm(size, _NORM_EPS, dtype)
    return nn.LayerNorm(size, _NORM_EPS, dtype=dtype)


def _required(d: dict[str, Any], key: str) -> Any:
    if d.get(key) is None:
        raise ValueError(f"config 'vision_config' is missing {key!r}")
    return d[key]
