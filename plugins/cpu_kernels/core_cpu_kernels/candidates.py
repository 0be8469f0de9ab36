"""The kernels core::linear, core::quant_linear, core::fp8_linear, core::fused_moe and
prefill attention choose among by timing.

Which is fastest depends on the CPU and on the row count (core.kernel_choice): on an AVX2
EPYC the GEMV beats torch's BLAS for decode rows and a float32 decode batch runs faster on
oneDNN's prepacked weight; on an AMX Xeon, oneDNN's prepacked bf16 GEMM is 1.2-2x torch's
at decode batch sizes and ~10x any vdpbf16ps or float32 path, and packed 4-bit weights pay
only for a few rows (../shared/measurements/intel-amx-2026-12-06.md). So each of these is a
`KernelCandidate` and the worker times them on the model's shapes at start.

core::linear (x [rows, K], weight [N, K], bias [N] | None), weight format = its dtype:
  gemv    the C++ GEMV (`_C.dense_linear`): streams each weight row once
  torch   core's reference (`F.linear`, torch's BLAS)
  onednn  oneDNN's matmul on a copy of W reordered once into its blocked layout
core::quant_linear (x [rows, K], qweight, scales, mins, bits), format "q{bits}/{x dtype}":
  packed        the C++ kernels on the packed weight (GEMV, blocked and tiled GEMMs)
  strips        bf16 dot products on a copy of W dequantized once to bf16 strips
  interleaved   bf16 decode rows times W laid out once in blocks of 16 rows
                (`_C.quant_linear_interleaved`: as many bytes as W), its values widened
                16 rows at a time; past the GEMV's rows, the packed kernels
  dequantized   torch's BLAS on a copy of W dequantized once to x's dtype
  dequantized-onednn  oneDNN on that copy, reordered
core::fp8_linear (x [rows, K], weight float8_e4m3fn [N, K], scales, block_k), format
"e4m3/{x dtype}":
  fp8           the C++ kernels on the 1-byte weight (`_C.fp8_linear`: GEMV, blocked GEMM),
                each value converted to float32 in registers
  dequantized   torch's BLAS on a copy of W dequantized once to x's dtype
  dequantized-onednn  oneDNN on that copy, reordered
  Microseconds a call (median of 3 runs of the fastest of 5-40 interleaved calls), AMD EPYC
  Zen 3, 2 threads, per-channel scales, fp8 / dequantized / dequantized-onednn (float32
  only: oneDNN has no bf16 kernels on this CPU):
    W [N, K]   x         1 row               8 rows               64 rows
    576x576    bfloat16  45 / 59             114 / 331            354 / 2478
               float32   43 / 50 / 69        111 / 144 / 94       345 / 403 / 342
    1536x576   bfloat16  107 / 127           291 / 870            1009 / 7368
               float32   109 / 128 / 126     267 / 338 / 200      786 / 1058 / 924
    576x1536   bfloat16  104 / 113           278 / 699            929 / 5775
               float32   109 / 131 / 126     273 / 327 / 201      835 / 944 / 876
    49152x576  bfloat16  3475 / 3807         9138 / 27373         25657 / 197110
               float32   3415 / 9024 / 5193  9287 / 21176 / 7375  24965 / 48048 / 28391
  fp8 wins every bfloat16 call (torch's bf16 matmul has no bf16 instructions here) and
  float32 single rows (the 49152-row head reads 28 MB, not a 113 MB float32 copy); oneDNN's
  copy wins float32 batches of 8, and the two are within 15% at 64 float32 rows.
prefill attention (query [q_len, Hq, D], kv_cache, block_ids, seq_len, scale, window,
kv_scales), format = the dtype ("fp8/{dtype}" for an FP8 cache), shape (Hq, Hkv, D), rows =
the chunk's q_len, timed on prompts without cached context:
  paged   the C++ flash kernel on float32 outer products (`_C.paged_prefill_attention`)
  sdpa    torch's flash kernel (oneDNN's brgemm for bf16: AMX tiles where the CPU has
          them) on the pages gathered (an FP8 cache's dequantized), where it takes the
          chunk (sdpa_prefill.py), else the C++ kernel
core::fused_moe (hidden [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights, topk_ids),
format = the dtype, shape (E, I, H, K), rows = T, timed on uniformly random routing:
  reference  core's reference: a pair of torch matmuls per expert over its tokens
  grouped    the C++ kernel (`_C.fused_moe`): slots grouped by expert, dense_linear's
             GEMVs over each expert's weights, float32 sums rounded once
Copies are weight_copies.py's: made once per weight, within one memory budget; where the
budget is spent the candidate multiplies without one (the reference's way).
"""

from __future__ import annotations

import functools
import os
from abc import abstractmethod
from typing import Any

import torch

from core import batch_invariant
from core.attention.kv_cache_dtype import FP8_KV_CACHE_DTYPES, KVCacheScales
from core.kernel_choice import KERNEL_CHOICES, KernelCandidate, OpTiming, Problem
from core.ops import (
    fp8_linear_reference,
    fused_moe_reference,
    linear_reference,
    quant_linear_reference,
)
from core.ops.fp8_linear import dequantize as dequantize_fp8
from core.ops.quant_linear import dequantize, num_inputs
from core_cpu_kernels import _C, packed_linear, sdpa_prefill, weight_copies

PROVIDER = "core-cpu-kernels"
_STRIP_ROWS = 64  # the strips' rows (quant_linear.h's kStripRows)
_INTERLEAVED_ROWS = 16  # an interleaved block's rows (quant_linear.h's kInterleavedRows)
_COPY_GROUP = 32  # the group size `Interleaved.copy_bytes` counts (a problem has none)
_INTERLEAVED_FORMATS = ("q4/bfloat16", "q8/bfloat16")


def linear_problem(weight: torch.Tensor) -> Problem:
    return Problem("linear", _dtype_name(weight.dtype), tuple(weight.shape))


def quant_linear_problem(x: torch.Tensor, qweight: torch.Tensor, bits: int) -> Problem:
    shape = (qweight.shape[0], num_inputs(qweight, bits))
    return Problem("quant_linear", f"q{bits}/{_dtype_name(x.dtype)}", shape)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _activation_dtype(problem: Problem) -> torch.dtype:
    return getattr(torch, problem.format.rpartition("/")[2])


def _with_rows(problem: Problem, args: tuple, rows: int) -> tuple:
    """The op's arguments with a `rows`-row activation in place of the recorded one."""
    x = args[0]
    return (torch.randn(rows, x.shape[-1], dtype=x.dtype), *args[1:])


def _dense_bytes(n: int, k: int, dtype: torch.dtype) -> int:
    """A copy of an [n, k] weight in `dtype` (oneDNN's blocked layout pads nothing here)."""
    return n * k * dtype.itemsize


def _strips_bytes(n: int, k: int) -> int:
    """A weight's bf16 strips: n rounded up to whole strips, k bf16 values a row."""
    return -(-n // _STRIP_ROWS) * _STRIP_ROWS * k * 2


def _interleaved_bytes(n: int, k: int, groups: int, bits: int) -> int:
    """A weight's interleaved layout: n rounded up to whole blocks, each row's k values and
    a float32 scale and min a group."""
    return -(-n // _INTERLEAVED_ROWS) * _INTERLEAVED_ROWS * (k * bits // 8 + groups * 8)


# -- core::linear ------------------------------------------------------------------------


class Gemv(KernelCandidate):
    op, name, provider = "linear", "gemv", PROVIDER
    batch_invariant = True  # a row's sums read that row alone, in one order, at any count

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
        return _C.dense_linear(x, weight, bias, isa=linear_isa())


class TorchLinear(KernelCandidate):
    op, name, provider = "linear", "torch", PROVIDER

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
        return linear_reference(x, weight, bias)


class OnednnLinear(KernelCandidate):
    op, name, provider = "linear", "onednn", PROVIDER

    def available(self) -> bool:
        return packed_linear.available()

    def takes(self, problem: Problem) -> bool:
        return packed_linear.takes(_activation_dtype(problem))

    def copy_bytes(self, problem: Problem) -> int:
        return _dense_bytes(*problem.shape, _activation_dtype(problem))

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
        packed = packed_linear.packed_weight(weight)
        if packed is None:
            return linear_reference(x, weight, bias)
        return packed_linear.linear(x, packed, bias)


# -- core::quant_linear ------------------------------------------------------------------


class Packed(KernelCandidate):
    op, name, provider = "quant_linear", "packed", PROVIDER
    batch_invariant = True  # in the mode, the GEMV for every row count

    def __call__(self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 mins: torch.Tensor, bits: int) -> Any:  # fmt: skip
        if batch_invariant.enabled():
            _refuse_int8_activations()
            return _C.quant_linear(x, qweight, scales, mins, bits, isa=linear_isa(),
                                   batch_invariant=True)  # fmt: skip
        return _C.quant_linear(x, qweight, scales, mins, bits, isa=linear_isa(),
                               int8_x=int8_activations())  # fmt: skip


class Strips(KernelCandidate):
    op, name, provider = "quant_linear", "strips", PROVIDER

    def available(self) -> bool:
        return strips_available()

    def takes(self, problem: Problem) -> bool:
        # With int8 activations asked for, bf16 x takes them (the packed kernels) only.
        return _activation_dtype(problem) is torch.bfloat16 and not int8_activations()

    def copy_bytes(self, problem: Problem) -> int:
        return _strips_bytes(*problem.shape)

    def __call__(self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 mins: torch.Tensor, bits: int) -> Any:  # fmt: skip
        strips = strips_of(qweight, scales, mins, bits)
        return _C.quant_linear(x, qweight, scales, mins, bits, isa=linear_isa(), strips=strips)


def strips_of(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
              bits: int) -> torch.Tensor | None:  # fmt: skip
    """The weight's bf16 strips the strips candidate multiplies by (weight_copies.py's copy),
    or None where the copies' budget is spent (the packed kernels then serve)."""
    num_bytes = _strips_bytes(qweight.shape[0], num_inputs(qweight, bits))
    return weight_copies.copy_of(
        "bf16-strips", (qweight, scales, mins), num_bytes,
        lambda: _C.quant_linear_strips(qweight, scales, mins, bits),
    )  # fmt: skip


class Interleaved(KernelCandidate):
    op, name, provider = "quant_linear", "interleaved", PROVIDER

    def available(self) -> bool:
        return strips_available()  # the same bf16 dot products

    def takes(self, problem: Problem) -> bool:
        # With int8 activations asked for, bf16 x takes them (the packed kernels) only.
        return problem.format in _INTERLEAVED_FORMATS and not int8_activations()

    def copy_bytes(self, problem: Problem) -> int:
        # GGUF's groups; a weight of larger groups keeps fewer scales (a problem does not
        # say its group size).
        n, k = problem.shape
        bits = int(problem.format.partition("/")[0].removeprefix("q"))
        return _interleaved_bytes(n, k, k // _COPY_GROUP, bits)

    def __call__(self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 mins: torch.Tensor, bits: int) -> Any:  # fmt: skip
        copy = interleaved_of(qweight, scales, mins, bits)
        return _C.quant_linear(x, qweight, scales, mins, bits, isa=linear_isa(),
                               interleaved=copy)  # fmt: skip


def interleaved_of(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                   bits: int) -> torch.Tensor | None:  # fmt: skip
    """The weight's interleaved layout the interleaved candidate multiplies by
    (weight_copies.py's copy), or None where the copies' budget is spent (the packed
    kernels then serve)."""
    k = num_inputs(qweight, bits)
    num_bytes = _interleaved_bytes(qweight.shape[0], k, scales.shape[1], bits)
    return weight_copies.copy_of(
        "interleaved", (qweight, scales, mins), num_bytes,
        lambda: _C.quant_linear_interleaved(qweight, scales, mins, bits),
    )  # fmt: skip


class DequantizedCopy(KernelCandidate):
    """W dequantized once to x's dtype (a copy of weight_copies.py's), multiplied by torch
    (`onednn=False`) or by oneDNN on the copy reordered into its blocked layout. A subclass
    names its op and says which of its arguments make W, and how (the weight's arguments
    come after x, the first the weight itself: its rows are W's)."""

    provider = PROVIDER

    def __init__(self, onednn: bool) -> None:
        self.onednn = onednn
        self.name = "dequantized-onednn" if onednn else "dequantized"

    def available(self) -> bool:
        return not self.onednn or packed_linear.available()

    def takes(self, problem: Problem) -> bool:
        dtype = _activation_dtype(problem)
        # W rounded to float16 would break the ops' contracts (only bf16 x may multiply a
        # rounded W).
        if dtype not in (torch.float32, torch.bfloat16):
            return False
        return packed_linear.takes(dtype) if self.onednn else True

    def copy_bytes(self, problem: Problem) -> int:
        return _dense_bytes(*problem.shape, _activation_dtype(problem))

    def __call__(self, x: torch.Tensor, *weight: Any) -> Any:
        num_bytes = _dense_bytes(weight[0].shape[0], x.shape[1], x.dtype)
        copy = weight_copies.copy_of(
            f"{self.name} {x.dtype}", self.sources(*weight), num_bytes,
            lambda: self._make(weight, x.dtype),
        )  # fmt: skip
        if copy is None:
            return self.reference(x, *weight)
        if self.onednn:
            return packed_linear.linear(x, copy, None)
        return linear_reference(x, copy, None)

    def _make(self, weight: tuple, dtype: torch.dtype) -> torch.Tensor:
        dense = self.dequantize(*weight).to(dtype)
        return packed_linear.reorder(dense) if self.onednn else dense

    @abstractmethod
    def sources(self, *weight: Any) -> tuple[torch.Tensor, ...]:
        """The tensors W is made from (the copy is remade when one is written)."""

    @abstractmethod
    def dequantize(self, *weight: Any) -> torch.Tensor:
        """W [N, K] in float32."""

    @abstractmethod
    def reference(self, x: torch.Tensor, *weight: Any) -> torch.Tensor:
        """The op's reference, for a call the budget gives no copy."""


class Dequantized(DequantizedCopy):
    """core::quant_linear's dequantized copies."""

    op = "quant_linear"

    def takes(self, problem: Problem) -> bool:
        # With int8 activations asked for, bf16 x takes them (the packed kernels) only.
        if _activation_dtype(problem) is torch.bfloat16 and int8_activations():
            return False
        return super().takes(problem)

    def sources(self, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                bits: int) -> tuple[torch.Tensor, ...]:  # fmt: skip
        return qweight, scales, mins

    def dequantize(self, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                   bits: int) -> torch.Tensor:  # fmt: skip
        return dequantize(qweight, scales, mins, bits)

    def reference(self, x: torch.Tensor, *weight: Any) -> torch.Tensor:
        return quant_linear_reference(x, *weight)


# -- core::fp8_linear ----------------------------------------------------------------------


def fp8_linear_problem(x: torch.Tensor, weight: torch.Tensor) -> Problem:
    return Problem("fp8_linear", f"e4m3/{_dtype_name(x.dtype)}", tuple(weight.shape))


class Fp8(KernelCandidate):
    op, name, provider = "fp8_linear", "fp8", PROVIDER
    batch_invariant = True  # in the mode, the GEMV for every row count

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                 block_k: int) -> Any:  # fmt: skip
        return _C.fp8_linear(x, weight, scales, block_k, isa=linear_isa(),
                             batch_invariant=batch_invariant.enabled())  # fmt: skip


class Fp8Dequantized(DequantizedCopy):
    """core::fp8_linear's dequantized copies."""

    op = "fp8_linear"

    def sources(self, weight: torch.Tensor, scales: torch.Tensor,
                block_k: int) -> tuple[torch.Tensor, ...]:  # fmt: skip
        return weight, scales

    def dequantize(self, weight: torch.Tensor, scales: torch.Tensor, block_k: int) -> torch.Tensor:
        return dequantize_fp8(weight, scales, block_k)

    def reference(self, x: torch.Tensor, *weight: Any) -> torch.Tensor:
        return fp8_linear_reference(x, *weight)


# -- core::fused_moe ----------------------------------------------------------------------


def fused_moe_problem(hidden: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor) -> Problem:
    experts, two_inter, size = w13.shape
    shape = (experts, two_inter // 2, size, topk_ids.shape[1])
    return Problem("fused_moe", _dtype_name(hidden.dtype), shape)


def _with_tokens(problem: Problem, args: tuple, rows: int) -> tuple:
    """The op's arguments for `rows` new tokens, each routed to K distinct experts drawn
    uniformly (the recorded call's routing is a dummy batch's), the recorded weights kept."""
    hidden, w13, w2, _, topk_ids = args
    experts, _, size, top_k = problem.shape
    ids = torch.rand(rows, experts).argsort(dim=1)[:, :top_k].to(topk_ids.dtype)
    weights = torch.rand(rows, top_k).softmax(dim=1)
    return (torch.randn(rows, size, dtype=hidden.dtype), w13, w2, weights, ids)


class ReferenceMoe(KernelCandidate):
    op, name, provider = "fused_moe", "reference", PROVIDER

    def __call__(self, *args: Any) -> torch.Tensor:
        return fused_moe_reference(*args)


class GroupedMoe(KernelCandidate):
    op, name, provider = "fused_moe", "grouped", PROVIDER
    # Each slot's row through dense_linear's GEMVs, each token's slots summed in slot order.
    batch_invariant = True

    def takes(self, problem: Problem) -> bool:
        return problem.format in ("float32", "bfloat16")

    def __call__(self, *args: Any) -> torch.Tensor:
        return _C.fused_moe(*args)


# -- prefill attention ---------------------------------------------------------------------

_BLOCK_SIZE = 16  # of the synthetic cache prefills are timed on
_FP8_FORMAT = "fp8/"  # a problem's format prefix where the cache is FP8
# An FP8 cache's timing: both formats convert alike (fp8.h), so e4m3 stands for either.
_TIMED_FP8_DTYPE = FP8_KV_CACHE_DTYPES["fp8_e4m3"]


def prefill_attention_problem(query: torch.Tensor, num_kv_heads: int, fp8_cache: bool) -> Problem:
    _, hq, d = query.shape
    cache = _FP8_FORMAT if fp8_cache else ""
    return Problem("prefill_attention", cache + _dtype_name(query.dtype), (hq, num_kv_heads, d))


def _prompt_of(problem: Problem, args: tuple, rows: int) -> tuple:
    """A `rows`-token prompt without cached context, its K/V in a fresh cache (FP8 for an
    FP8 problem; the recorded call's scale, window and cache scales kept)."""
    query, _, _, _, scale, window, kv_scales = args
    hq, hkv, d = problem.shape
    num_blocks = -(-rows // _BLOCK_SIZE)
    fp8 = problem.format.startswith(_FP8_FORMAT)
    cache = torch.randn(num_blocks, 2, _BLOCK_SIZE, hkv, d)
    cache = cache.to(_TIMED_FP8_DTYPE if fp8 else query.dtype)
    q = torch.randn(rows, hq, d).to(query.dtype)
    return (q, cache, torch.arange(num_blocks), rows, scale, window, kv_scales)


def _paged_prefill(query: torch.Tensor, kv_cache: torch.Tensor, block_ids: torch.Tensor,
                   seq_len: int, scale: float, window: int,
                   kv_scales: KVCacheScales) -> torch.Tensor:  # fmt: skip
    """One chunk through the C++ flash kernel."""
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    rows = [0, query.shape[0]]
    _C.paged_prefill_attention(out, query, kv_cache, block_ids[None], rows, [seq_len], scale,
                               window, kv_scales.k_scale, kv_scales.v_scale)  # fmt: skip
    return out


class PagedPrefill(KernelCandidate):
    op, name, provider = "prefill_attention", "paged", PROVIDER

    def __call__(self, *args: Any) -> torch.Tensor:
        return _paged_prefill(*args)


class SdpaPrefill(KernelCandidate):
    op, name, provider = "prefill_attention", "sdpa", PROVIDER

    def takes(self, problem: Problem) -> bool:
        return _activation_dtype(problem) in (torch.float32, torch.bfloat16)

    def __call__(self, query: torch.Tensor, kv_cache: torch.Tensor, block_ids: torch.Tensor,
                 seq_len: int, scale: float, window: int,
                 kv_scales: KVCacheScales) -> torch.Tensor:  # fmt: skip
        args = (query, kv_cache, block_ids, seq_len, scale, window, kv_scales)
        if not sdpa_prefill.takes(query, kv_cache, seq_len, window):
            return _paged_prefill(*args)
        return sdpa_prefill.sdpa_prefill(*args)


def linear_isa() -> str:
    """CORE_CPU_ISA (read at each call; default "", the widest): the vector ISA whose kernels
    the gemv, packed, strips, interleaved and fp8 candidates run, one of
    `_C.quant_linear_isas()` ("avx512", "avx2", "scalar" where the CPU runs them), so that a
    machine's narrower kernels can be checked end to end (tests, batch-invariant mode on
    each ISA). The other ops (attention, norms, rotary) always take the widest, and the
    kernel choices measured at start are not keyed on it; an ISA this CPU lacks is refused
    at the first linear layer (RuntimeError naming it)."""
    return os.environ.get("CORE_CPU_ISA", "")


def _refuse_int8_activations() -> None:
    if int8_activations():
        raise ValueError(
            "CORE_CPU_INT8_ACTIVATIONS=1 quantizes each token's activations for the GEMMs, "
            "which batch-invariant mode (--batch-invariant) does not take: unset one of them"
        )


def int8_activations() -> bool:
    """CORE_CPU_INT8_ACTIVATIONS=1 (read at each call; off by default): core::quant_linear
    multiplies on int8 dot products, x quantized per token and run of 32 inputs, where W's
    groups are whole runs: the GEMV (decode rows, any dtype) on every x86 ISA, with AVX2's
    integer multiply-adds, and the GEMMs of bfloat16 activations where the CPU has
    AVX512_VNNI (with AVX512_BF16). The GEMV is then 1.3-1.6x faster (SmolLM2's 4-bit
    layers, AVX2 EPYC, float32) and the GEMMs 1.2-1.4x, at a quality cost: the default
    model's perplexity rises 0.24% (bf16 GEMMs: 35.14 -> 35.22 on the held-out text; 35.59
    before 4-bit values were counted from 8) and its greedy answer to "What is the capital
    of France?" (whose two likeliest first tokens lie 0.09 apart in float32) changes, so it
    is never on unless asked for; when on, bf16 activations take the packed kernels only."""
    return os.environ.get("CORE_CPU_INT8_ACTIVATIONS", "") not in ("", "0")


@functools.cache
def strips_available() -> bool:
    """Whether the widest ISA here multiplies strips (has bf16 dot products)."""
    return _C.quant_linear_has_strips()


def register() -> None:
    """Add the candidates to core's kernel choices (re-entrant). The first of each op
    serves until the worker has measured: the reference's way (linear, fused_moe), the
    packed kernels, the FP8 kernels, the C++ flash kernel."""
    KERNEL_CHOICES.declare_op("linear", OpTiming(_with_rows, weights_stream=True))
    KERNEL_CHOICES.declare_op("quant_linear", OpTiming(_with_rows, weights_stream=True))
    KERNEL_CHOICES.declare_op("fp8_linear", OpTiming(_with_rows, weights_stream=True))
    KERNEL_CHOICES.declare_op("fused_moe", OpTiming(_with_tokens))
    KERNEL_CHOICES.declare_op("prefill_attention", OpTiming(_prompt_of))
    for candidate in (TorchLinear(), Gemv(), OnednnLinear()):
        KERNEL_CHOICES.register(candidate)
    for candidate in (Packed(), Strips(), Interleaved(), Dequantized(False), Dequantized(True)):
        KERNEL_CHOICES.register(candidate)
    for candidate in (Fp8(), Fp8Dequantized(False), Fp8Dequantized(True)):
        KERNEL_CHOICES.register(candidate)
    for candidate in (PagedPrefill(), SdpaPrefill()):
        KERNEL_CHOICES.register(candidate)
    for candidate in (ReferenceMoe(), GroupedMoe()):
        KERNEL_CHOICES.register(candidate)
