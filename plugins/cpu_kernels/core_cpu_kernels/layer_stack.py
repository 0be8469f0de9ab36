"""core-cpu-kernels' layer stack (core.models.layer_stack): a step of decode rows through a
model's plain decoder layers in one call of `_C.decode_layers`, which runs the kernels
the layers' ops would choose (the packed GEMV, the norms, rotary, the KV write and the
paged decode kernel) in the layers' order, so the outputs are theirs to the bit.

It serves a step only where every layer would run exactly those kernels, and declines it
otherwise (the layers then run as usual): prefill chunks or padded rows, a step without
attention metadata (the dummy run, which records the kernel problems), batch-invariant
mode, a KV connector, an FP8 cache, a backend other than `cpu_paged` itself, weights that
are not packed (`LinearMethod.packed_weight`: a float layer, a LoRA wrapper), a row count
whose kernel choice is neither the packed nor the strips candidate (both are this
package's C++ kernels: the stack passes a layer the strips its op would multiply by),
dtypes or layouts the kernels take through another path.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core import batch_invariant
from core.attention.interface import AttentionType
from core.forward_context import get_forward_context
from core.kernel_choice import KERNEL_CHOICES, Problem
from core.models.layer_stack import LayerStack, PlainLayer
from core_cpu_kernels import _C, candidates
from core_cpu_kernels.backend import CpuPagedImpl
from core_cpu_kernels.ops import DTYPES, takes_packed_weight


def build(layers: Sequence[PlainLayer]) -> LayerStack | None:
    """A stack for `layers` where they are on the CPU and share their heads' shape (one
    `heads` argument), else None."""
    shapes = {(layer.num_heads, layer.num_kv_heads, layer.head_dim) for layer in layers}
    on_cpu = all(layer.input_norm.weight.device.type == "cpu" for layer in layers)
    if len(shapes) != 1 or not on_cpu:
        return None
    return DecodeStack(layers)


@dataclass
class _Gathered:
    """What `_C.decode_layers` reads of the layers besides the step, gathered once for a
    binding of their methods, backends and caches (`DecodeStack._binding`)."""

    tensors: list[torch.Tensor]
    bits: list[int]
    eps: list[float]
    scales: list[float]
    windows: list[int]
    block_size: int
    # One (problem, weight tensors and bits) per distinct packed weight shape: the kernel
    # choice for the step's row count must be the packed or the strips candidate.
    problems: list[tuple[Problem, tuple]]
    # Each linear layer's problem (an index into `problems`) and the slot of its strips in
    # `tensors` (an empty tensor there: the packed kernel), its weight's three before it.
    linears: list[tuple[int, int]]


class DecodeStack:
    """`_C.decode_layers` over `layers`. The weights are gathered again only when a layer's
    linear method, attention backend or cache is rebound (parameters and buffers keep their
    identity: sleep mode empties and refills them in place); the step's metadata and the
    kernel choices are read at each call."""

    def __init__(self, layers: Sequence[PlainLayer]) -> None:
        self.layers = list(layers)
        first = self.layers[0]
        self.heads = [first.num_heads, first.num_kv_heads, first.head_dim]
        self._bound: list[Any] = []  # the binding `_gathered` was made for
        self._gathered: _Gathered | None = None

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
        per_layer = context.attn_metadata
        metadata = per_layer.get(self.layers[0].attn.layer_name)
        if context.kv_connector is not None or not _decode_only(metadata, hidden.shape[0]):
            return None
        if any(per_layer.get(layer.attn.layer_name) is not metadata for layer in self.layers):
            return None
        gathered = self._current(hidden)
        strips = None if gathered is None else _strips_chosen(gathered.problems, hidden)
        if strips is None:
            return None
        return dict(
            hidden=hidden, positions=positions, tensors=_with_strips(gathered, strips),
            bits=gathered.bits,
            eps=gathered.eps, scales=gathered.scales, windows=gathered.windows, heads=self.heads,
            block_table=metadata.decode.block_table, seq_lens=metadata.decode.seq_lens,
            key_rows=metadata.key_rows(gathered.block_size), block_size=gathered.block_size,
            isa=candidates.linear_isa(), int8_x=candidates.int8_activations(),
        )  # fmt: skip

    def _current(self, hidden: torch.Tensor) -> _Gathered | None:
        """The gathered weights for the layers' present binding (None: not all served)."""
        bound = self._binding(hidden.dtype)
        if len(bound) != len(self._bound) or not all(map(operator.is_, bound, self._bound)):
            self._bound, self._gathered = bound, _gather(self.layers, hidden.dtype)
        return self._gathered

    def _binding(self, dtype: torch.dtype) -> list[Any]:
        bound: list[Any] = [dtype]
        for layer in self.layers:
            bound += [layer.attn.impl, layer.attn.kv_cache]
            bound += [linear.linear_method for linear in _linears(layer)]
        return bound


def _gather(layers: list[PlainLayer], dtype: torch.dtype) -> _Gathered | None:
    """What `_C.decode_layers` reads of `layers` for activations of `dtype`, or None where
    a layer runs any other kernel than it does."""
    gathered = _Gathered([], [], [], [], [], 0, [], [])
    shapes: dict[tuple, int] = {}  # (shape, bits) -> its index in gathered.problems
    for layer in layers:
        impl, cache = layer.attn.impl, layer.attn.kv_cache
        linears = [_packed(linear) for linear in _linears(layer)]
        norms = (layer.input_norm.weight, layer.post_norm.weight)
        rotary = layer.rotary
        if (
            not _takes_attention(impl, cache, dtype)
            or None in linears
            or not all(_takes_norm(weight, dtype) for weight in norms)
            or not _takes_tables(rotary.cos_cache, rotary.sin_cache)
        ):
            return None
        problems = [_problem_index(gathered, weight, shapes, dtype) for weight in linears]
        qkv, o, gate_up, down = ([*weight[:3], _NO_STRIPS] for weight in linears)
        base = len(gathered.tensors)
        gathered.tensors += [norms[0], *qkv, rotary.cos_cache, rotary.sin_cache, cache,
                             *o, norms[1], *gate_up, *down]  # fmt: skip
        slots = [i for i in range(base, len(gathered.tensors)) if gathered.tensors[i] is _NO_STRIPS]
        gathered.linears += zip(problems, slots, strict=True)
        gathered.bits += [weight[3] for weight in linears]
        gathered.eps += [layer.input_norm.eps, layer.post_norm.eps]
        gathered.scales.append(impl.scale)
        gathered.windows.append(impl.sliding_window or 0)
        gathered.block_size = cache.shape[2]
    return gathered


_NO_STRIPS = torch.empty(0, dtype=torch.bfloat16)


def _problem_index(
    gathered: _Gathered, weight: tuple, shapes: dict[tuple, int], dtype: torch.dtype
) -> int:
    """The index in `gathered.problems` of the weight's problem, added if new."""
    qweight, _, _, bits = weight
    key = (qweight.shape, bits)
    if key not in shapes:
        shapes[key] = len(gathered.problems)
        problem = candidates.quant_linear_problem(torch.empty(0, dtype=dtype), qweight, bits)
        gathered.problems.append((problem, weight))
    return shapes[key]


def _strips_chosen(
    problems: list[tuple[Problem, tuple]], hidden: torch.Tensor
) -> list[bool] | None:
    """Per weight shape, whether core::quant_linear's kernel choice at this row count is the
    strips candidate (False: the packed one), or None where one is another (the layers run)."""
    rows, chosen = hidden.shape[0], []
    for problem, weight in problems:
        kernel = KERNEL_CHOICES.kernel(problem, rows, (hidden, *weight))
        if not isinstance(kernel, candidates.Packed | candidates.Strips):
            return None
        chosen.append(isinstance(kernel, candidates.Strips))
    return chosen


def _with_strips(gathered: _Gathered, strips: list[bool]) -> list[torch.Tensor]:
    """The gathered tensors with the strips of each linear layer whose kernel is the strips
    candidate: the copy its op multiplies by (none where the copies' budget is spent)."""
    if not any(strips):
        return gathered.tensors
    tensors = list(gathered.tensors)
    for problem, slot in gathered.linears:
        if strips[problem]:
            copy = candidates.strips_of(*tensors[slot - 3 : slot], gathered.problems[problem][1][3])
            if copy is not None:
                tensors[slot] = copy
    return tensors


def _linears(layer: PlainLayer) -> tuple[torch.nn.Module, ...]:
    return (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)


def _takes_step(positions: torch.Tensor, hidden: torch.Tensor) -> bool:
    return (
        hidden.dtype in DTYPES
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


def _packed(linear: torch.nn.Module) -> tuple | None:
    """(qweight, scales, mins, bits) where the layer's method multiplies by a packed weight
    the C++ kernel takes as it lies."""
    weight = linear.linear_method.packed_weight(linear)
    if weight is None:
        return None
    tensors = (weight.qweight, weight.scales, weight.mins, weight.bits)
    return tensors if takes_packed_weight(*tensors) else None


def _takes_norm(weight: torch.Tensor, dtype: torch.dtype) -> bool:
    return weight.dtype is dtype and weight.dim() == 1 and weight.is_contiguous()


def _takes_tables(cos: torch.Tensor, sin: torch.Tensor) -> bool:
    return cos.dtype is sin.dtype is torch.float32 and cos.is_contiguous() and sin.is_contiguous()
