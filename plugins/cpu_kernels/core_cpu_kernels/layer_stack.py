"""core-cpu-kernels' layer stack (core.models.layer_stack): a step of decode rows through a
model's plain decoder layers in one call of `_C.decode_layers`, which runs the kernels
the layers' ops would choose (the packed GEMV, the norms, rotary, the KV write and the
paged decode kernel) in the layers' order, so the outputs are theirs to the bit.

It serves a step only where every layer would run exactly those kernels, and declines it
otherwise (the layers then run as usual): prefill chunks or padded rows, a step without
attention metadata (the dummy run, which records the kernel problems), batch-invariant
mode, a KV connector, an FP8 cache, a backend other than `cpu_paged` itself, weights that
are not packed (`LinearMethod.packed_weight`: a float layer, a LoRA wrapper), a row count
whose kernel choice is not the packed candidate, dtypes or layouts the kernels take
through another path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from core import batch_invariant
from core.attention.interface import AttentionType
from core.forward_context import get_forward_context
from core.kernel_choice import KERNEL_CHOICES
from core.models.layer_stack import LayerStack, PlainLayer
from core_cpu_kernels import _C, candidates
from core_cpu_kernels.backend import CpuPagedImpl

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_QWEIGHT_DTYPES = {4: torch.uint8, 8: torch.int8}


def build(layers: Sequence[PlainLayer]) -> LayerStack | None:
    """A stack for `layers` where they share their heads' shape (one `heads` argument),
    else None."""
    shapes = {(layer.num_heads, layer.num_kv_heads, layer.head_dim) for layer in layers}
    if len(shapes) != 1:
        return None
    return DecodeStack(layers)


class DecodeStack:
    """`_C.decode_layers` over `layers`, reading their weights and caches at each call."""

    def __init__(self, layers: Sequence[PlainLayer]) -> None:
        self.layers = list(layers)
        first = self.layers[0]
        self.heads = [first.num_heads, first.num_kv_heads, first.head_dim]

    def __call__(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        arguments = None if residual is not None else self._arguments(positions, hidden)
        return None if arguments is None else _C.decode_layers(**arguments)

    def _arguments(self, positions: torch.Tensor, hidden: torch.Tensor) -> dict[str, Any] | None:
        """`_C.decode_layers`' arguments for this step, or None where it cannot serve it."""
        if batch_invariant.enabled() or not _takes_step(positions, hidden):
            return None
        context = get_forward_context()
        metadata = context.attn_metadata.get(self.layers[0].attn.layer_name)
        if context.kv_connector is not None or not _decode_only(metadata, hidden.shape[0]):
            return None
        packed_kernel: dict[tuple, bool] = {}  # (N, K, bits) -> served by the packed kernel
        tensors: list[torch.Tensor] = []
        bits: list[int] = []
        eps: list[float] = []
        scales: list[float] = []
        windows: list[int] = []
        for layer in self.layers:
            attn = layer.attn
            if context.attn_metadata.get(attn.layer_name) is not metadata:
                return None
            impl, cache = attn.impl, attn.kv_cache
            if not _takes_attention(impl, cache, hidden.dtype):
                return None
            linears = [_packed(m, hidden, packed_kernel) for m in _linears(layer)]
            norms = (layer.input_norm, layer.post_norm)
            if None in linears or not all(_takes_norm(n.weight, hidden) for n in norms):
                return None
            rotary = layer.rotary
            if not _takes_tables(rotary.cos_cache, rotary.sin_cache):
                return None
            qkv, o, gate_up, down = linears
            tensors += [layer.input_norm.weight, *qkv[:3], rotary.cos_cache, rotary.sin_cache,
                        cache, *o[:3], layer.post_norm.weight, *gate_up[:3], *down[:3]]  # fmt: skip
            bits += [w[3] for w in linears]
            eps += [layer.input_norm.eps, layer.post_norm.eps]
            scales.append(impl.scale)
            windows.append(impl.sliding_window or 0)
        cache = self.layers[0].attn.kv_cache
        return dict(
            hidden=hidden, positions=positions, tensors=tensors, bits=bits, eps=eps,
            scales=scales, windows=windows, heads=self.heads,
            block_table=metadata.decode.block_table, seq_lens=metadata.decode.seq_lens,
            key_rows=metadata.key_rows(cache.shape[2]), block_size=cache.shape[2],
            isa=candidates.linear_isa(), int8_x=candidates.int8_activations(),
        )  # fmt: skip


def _linears(layer: PlainLayer) -> tuple[torch.nn.Module, ...]:
    return (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)


def _takes_step(positions: torch.Tensor, hidden: torch.Tensor) -> bool:
    return (
        hidden.dtype in _DTYPES
        and hidden.dim() == 2
        and hidden.shape[0] > 0
        and hidden.is_contiguous()
        and positions.dtype is torch.int64
        and positions.dim() == 1
        and positions.is_contiguous()
        and positions.shape[0] == hidden.shape[0]
    )


def _decode_only(metadata: Any, num_tokens: int) -> bool:
    """Whether the step is decode rows alone, one per token, none padded (the backend's
    forward then takes its decode path for the whole step)."""
    decode = getattr(metadata, "decode", None)
    return (
        decode is not None
        and not metadata.prefills
        and decode.token_rows == slice(0, num_tokens)
        and len(metadata.slot_mapping) == num_tokens
    )


def _takes_attention(impl: Any, cache: torch.Tensor | None, dtype: torch.dtype) -> bool:
    """cpu_paged's own impl on a contiguous cache in the model's dtype: its forward is
    then the K/V write and `_C.paged_decode_attention` for a decode step."""
    return (
        type(impl) is CpuPagedImpl
        and impl.kv_scales is None
        and impl.attn_type is AttentionType.DECODER
        and cache is not None
        and cache.dtype is dtype
        and cache.dim() == 5
        and cache.is_contiguous()
    )


def _packed(linear: torch.nn.Module, hidden: torch.Tensor, packed_kernel: dict) -> tuple | None:
    """(qweight, scales, mins, bits) where the layer's method multiplies by a packed weight
    that core::quant_linear serves with the packed candidate at this row count (asked once
    a step per weight shape, through `packed_kernel`)."""
    weight = linear.linear_method.packed_weight(linear)
    if weight is None:
        return None
    qweight, scales, mins, bits = weight.qweight, weight.scales, weight.mins, weight.bits
    takes = (
        qweight.dtype is _QWEIGHT_DTYPES.get(bits)
        and scales.dtype is mins.dtype is torch.float32
        and qweight.is_contiguous()
        and scales.is_contiguous()
        and mins.is_contiguous()
    )
    if not takes:
        return None
    key = (*qweight.shape, *scales.shape, bits)
    served = packed_kernel.get(key)
    if served is None:
        args = (hidden, qweight, scales, mins, bits)
        problem = candidates.quant_linear_problem(hidden, qweight, bits)
        kernel = KERNEL_CHOICES.kernel(problem, hidden.shape[0], args)
        served = packed_kernel[key] = isinstance(kernel, candidates.Packed)
    return (qweight, scales, mins, bits) if served else None


def _takes_norm(weight: torch.Tensor, hidden: torch.Tensor) -> bool:
    return (
        weight.dtype is hidden.dtype
        and weight.shape == hidden.shape[-1:]
        and weight.is_contiguous()
    )


def _takes_tables(cos: torch.Tensor, sin: torch.Tensor) -> bool:
    return cos.dtype is sin.dtype is torch.float32 and cos.is_contiguous() and sin.is_contiguous()
