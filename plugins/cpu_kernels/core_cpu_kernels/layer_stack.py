"""core-cpu-kernels' layer stack (core.models.layer_stack): a step of decode rows through a
model's plain decoder layers in one call of `_C.DecodeLayers` (the layers' tensors gathered
once), which runs the kernels the layers' ops would choose (the packed GEMV, the norms,
rotary, the KV write and the paged decode kernel) in the layers' order, so the outputs are
theirs to the bit.

It serves a step only where every layer would run exactly those kernels, and declines it
otherwise (the layers then run as usual): prefill chunks or padded rows, a step without
attention metadata (the dummy run, which records the kernel problems), batch-invariant
mode, a KV connector, an FP8 cache, a backend other than `cpu_paged` itself, weights that
are not packed (`LinearMethod.packed_weight`: a float layer, a LoRA wrapper), a row count
whose kernel choice is not the packed, strips or interleaved candidate (all this
package's C++ kernels: the stack passes a layer the copy its op would multiply by),
dtypes or layouts the kernels take through another path.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
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
    """What `_C.DecodeLayers` reads of the layers, gathered once for a binding of their
    methods, backends and caches (`DecodeStack._binding`)."""

    tensors: list[torch.Tensor]
    bits: list[int]
    eps: list[float]
    scales: list[float]
    windows: list[int]
    block_size: int
    # One (problem, weight tensors and bits) per distinct packed weight shape: the kernel
    # choice for the step's row count must be one of _COPIES' candidates.
    problems: list[tuple[Problem, tuple]]
    # Each linear layer's problem (an index into `problems`) and the slot of its copy in
    # `tensors` (an empty tensor there: the packed kernel), its weight's three before it.
    linears: list[tuple[int, int]]
    # Every linear layer's weight tensors (what the copies are made from).
    weights: list[torch.Tensor]


class DecodeStack:
    """`_C.DecodeLayers` over `layers`. The weights are gathered again only when a layer's
    linear method, attention backend or cache is rebound (parameters and buffers keep their
    identity: sleep mode empties and refills them in place), and handed to C++ again when
    the copies chosen change or a weight they were made from is written in place; the
    step's metadata and the kernel choices are read at each call."""

    def __init__(self, layers: Sequence[PlainLayer]) -> None:
        self.layers = list(layers)
        first = self.layers[0]
        self.heads = [first.num_heads, first.num_kv_heads, first.head_dim]
        self._bound: list[Any] = []  # the binding `_gathered` was made for
        self._gathered: _Gathered | None = None
        # The gathered layers in C++, and the copies they multiply by.
        self._layers: tuple[list[CopyOf | None], Any] | None = None

    # What each step reads of the modules, collected once (a step's Python is a share of
    # its time at one stream).
    @functools.cached_property
    def _attention(self) -> list[torch.nn.Module]:
        return [layer.attn for layer in self.layers]

    @functools.cached_property
    def _layer_names(self) -> list[str]:
        return [attn.layer_name for attn in self._attention]

    @functools.cached_property
    def _linear_modules(self) -> list[torch.nn.Module]:
        return [linear for layer in self.layers for linear in _linears(layer)]

    def __call__(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        step = None if residual is not None else self._step(positions, hidden)
        if step is None:
            return None
        layers, arguments = step
        return layers(**arguments)

    def _step(self, positions: torch.Tensor, hidden: torch.Tensor) -> tuple[Any, dict] | None:
        """The `_C.DecodeLayers` for this step and its arguments, or None where it cannot
        serve it."""
        if batch_invariant.enabled() or not _takes_step(positions, hidden):
            return None
        context = get_forward_context()
        per_layer = context.attn_metadata
        metadata = per_layer.get(self._layer_names[0])
        if context.kv_connector is not None or not _decode_only(metadata, hidden.shape[0]):
            return None
        if any(per_layer.get(name) is not metadata for name in self._layer_names):
            return None
        gathered = self._current(hidden)
        copies = None if gathered is None else _copies_chosen(gathered.problems, hidden)
        if gathered is None or copies is None:
            return None
        return self._layers_with(gathered, copies), dict(
            hidden=hidden, positions=positions,
            block_table=metadata.decode.block_table, seq_lens=metadata.decode.seq_lens,
            key_rows=metadata.key_rows(gathered.block_size),
            isa=candidates.linear_isa(), int8_x=candidates.int8_activations(),
        )  # fmt: skip

    def _layers_with(self, gathered: _Gathered, copies: list[CopyOf | None]) -> Any:
        """The gathered layers in C++ with `copies`, handed over again only when the copies
        chosen change or a weight they were made from was written in place (a copy's lookup
        costs ~5 us a layer, a version read in Python ~0.3)."""
        last = self._layers
        if last is not None and last[0] == copies and not last[1].stale():
            return last[1]
        tensors = _with_copies(gathered, copies)
        # Inference tensors keep no version, and get no copy.
        copied = any(copies) and not any(weight.is_inference() for weight in gathered.weights)
        layers = _C.DecodeLayers(
            tensors, gathered.bits, gathered.eps, gathered.scales, gathered.windows,
            self.heads, gathered.block_size, gathered.weights if copied else [],
        )  # fmt: skip
        self._layers = (copies, layers)
        return layers

    def _current(self, hidden: torch.Tensor) -> _Gathered | None:
        """The gathered weights for the layers' present binding (None: not all served)."""
        bound = self._binding(hidden.dtype)
        if len(bound) != len(self._bound) or not all(map(operator.is_, bound, self._bound)):
            self._bound, self._gathered = bound, _gather(self.layers, hidden.dtype)
            self._layers = None
        return self._gathered

    def _binding(self, dtype: torch.dtype) -> list[Any]:
        return [
            dtype,
            *[attn.impl for attn in self._attention],
            *[attn.kv_cache for attn in self._attention],
            *[linear.linear_method for linear in self._linear_modules],
        ]


def _gather(layers: list[PlainLayer], dtype: torch.dtype) -> _Gathered | None:
    """What `_C.DecodeLayers` reads of `layers` for activations of `dtype`, or None where
    a layer runs any other kernel than it does."""
    gathered = _Gathered([], [], [], [], [], 0, [], [], [])
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
        qkv, o, gate_up, down = ([*weight[:3], _NO_COPY] for weight in linears)
        base = len(gathered.tensors)
        gathered.tensors += [norms[0], *qkv, rotary.cos_cache, rotary.sin_cache, cache,
                             *o, norms[1], *gate_up, *down]  # fmt: skip
        slots = [i for i in range(base, len(gathered.tensors)) if gathered.tensors[i] is _NO_COPY]
        gathered.linears += zip(problems, slots, strict=True)
        gathered.weights += [tensor for weight in linears for tensor in weight[:3]]
        gathered.bits += [weight[3] for weight in linears]
        gathered.eps += [layer.input_norm.eps, layer.post_norm.eps]
        gathered.scales.append(impl.scale)
        gathered.windows.append(impl.sliding_window or 0)
        gathered.block_size = cache.shape[2]
    return gathered


_NO_COPY = torch.empty(0, dtype=torch.bfloat16)

# The candidates whose kernels the stack runs, each with the copy of W its op multiplies by
# (None: W as it is).
CopyOf = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor | None]
_COPIES: tuple[tuple[type, CopyOf | None], ...] = (
    (candidates.Packed, None),
    (candidates.Strips, candidates.strips_of),
    (candidates.Interleaved, candidates.interleaved_of),
)


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


def _copies_chosen(
    problems: list[tuple[Problem, tuple]], hidden: torch.Tensor
) -> list[CopyOf | None] | None:
    """Per weight shape, the copy its kernel choice at this row count multiplies by (None:
    the packed weight), or None where a choice is none of _COPIES' (the layers run)."""
    rows, chosen = hidden.shape[0], []
    for problem, weight in problems:
        kernel = KERNEL_CHOICES.kernel(problem, rows, (hidden, *weight))
        found = [copy_of for kind, copy_of in _COPIES if isinstance(kernel, kind)]
        if not found:
            return None
        chosen.append(found[0])
    return chosen


def _with_copies(gathered: _Gathered, copies: list[CopyOf | None]) -> list[torch.Tensor]:
    """The gathered tensors with the copy each linear layer's op multiplies by (none where
    the copies' budget is spent)."""
    if not any(copies):
        return gathered.tensors
    tensors = list(gathered.tensors)
    for problem, slot in gathered.linears:
        copy_of = copies[problem]
        if copy_of is not None:
            copy = copy_of(*tensors[slot - 3 : slot], gathered.problems[problem][1][3])
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
