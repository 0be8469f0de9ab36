"""The CPU kernels of core::int8_linear, chosen per weight shape and row count by timing.

Which path is fastest depends on the CPU and on torch's build: torch._int_mm is the
natural int8 GEMM, but on an AVX2 CPU without int8 dot products it runs up to 20x slower
than a float32 GEMM on the same values (below), while where a CPU has VNNI or AMX-int8
and torch's kernels use them it can win. So each path is a `KernelCandidate`
(core.kernel_choice) and the worker times them on the model's shapes at start; none keeps
a copy of W.

core::int8_linear (x [rows, K], weight int8 [N, K], weight_scale [N]), format = x's dtype:
  int_mm    torch._int_mm: int8 products summed in int32, exact (the op's own semantics,
            so it serves until the worker has measured)
  widened   the int8 values widened to float32 per call, torch's float32 BLAS: exact
            products, float32 sums (a transient float32 copy of W per call, none kept)
  int8pack  bfloat16 x only: torch._weight_int8pack_mm reads the int8 W as it is, xq is
            exact in bfloat16 (|xq| <= 127) and the sums come back rounded to bfloat16

On an AMD EPYC (Zen 3: AVX2, no VNNI), one thread, the fastest of 20 interleaved calls
took, in ms (int_mm / widened / int8pack; a shared machine under load, so +-50%):
  2048 x 2048, float32 x:   1 row 4.9 / 2.5,   8 rows 40 / 4.5,   64 rows 290 / 15
  2048 x 2048, bfloat16 x:  1 row 3.0 / 2.9 / 0.7,   8 rows 27 / 4.2 / 2.1,   64 rows 269 / 14 / 16
  5632 x 2048, bfloat16 x:  1 row 13 / 55 / 2.0,   8 rows 92 / 66 / 5.8,   64 rows 867 / 106 / 74
The widened copy of a large W costs more than its GEMM saves at few rows; on another CPU
the order can differ, which is why the worker measures rather than follows a rule.

Core serves core::int8_linear on the CPU with these (`register`) unless a kernel package
registered its own kernel for it first; a package offers a faster path by registering
another candidate of op "int8_linear" instead, and the timing decides.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from core.kernel_choice import KERNEL_CHOICES, KernelCandidate, OpTiming, Problem
from core.ops.int8_linear import quantize_per_token, scale_sums
from core.ops.registry import CORE_OPS

PROVIDER = "core"
OP = "int8_linear"
# torch._weight_int8pack_mm returns garbage when K is not a multiple of 8 (torch 2.13, CPU).
_INT8PACK_K_MULTIPLE = 8


def int8_linear_problem(x: torch.Tensor, weight: torch.Tensor) -> Problem:
    return Problem(OP, str(x.dtype).removeprefix("torch."), tuple(weight.shape))


def int8_linear_cpu(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor
) -> torch.Tensor:
    """The kernel chosen for this weight shape and row count (core.kernel_choice)."""
    args = (x, weight, weight_scale)
    return KERNEL_CHOICES.kernel(int8_linear_problem(x, weight), x.shape[0], args)(*args)


def _with_rows(problem: Problem, args: tuple, rows: int) -> tuple:
    """The op's arguments with a `rows`-row activation in place of the recorded one."""
    x = args[0]
    return (torch.randn(rows, x.shape[1], dtype=x.dtype), *args[1:])


def _runs(call: Callable[[], object]) -> bool:
    """Whether `call` (a private torch op on tiny CPU tensors) runs in this build."""
    try:
        call()
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    return True


@functools.cache
def _int_mm_runs() -> bool:
    zeros = torch.zeros(1, _INT8PACK_K_MULTIPLE, dtype=torch.int8)
    return _runs(lambda: torch._int_mm(zeros, zeros.T))


@functools.cache
def _int8pack_runs() -> bool:
    zeros = torch.zeros(1, _INT8PACK_K_MULTIPLE, dtype=torch.int8)
    ones = torch.ones(1, dtype=torch.bfloat16)
    return _runs(lambda: torch._weight_int8pack_mm(zeros.bfloat16(), zeros, ones))


class IntMm(KernelCandidate):
    op, name, provider = OP, "int_mm", PROVIDER
    # Integer sums are exact in any order, and x is quantized per row: batch-invariant.
    batch_invariant = True

    def available(self) -> bool:
        return _int_mm_runs()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> Any:
        xq, x_scale = quantize_per_token(x)
        return scale_sums(torch._int_mm(xq, weight.T), x_scale, weight_scale, x.dtype)


class Widened(KernelCandidate):
    op, name, provider = OP, "widened", PROVIDER

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> Any:
        xq, x_scale = quantize_per_token(x)
        return scale_sums(xq.float() @ weight.float().T, x_scale, weight_scale, x.dtype)


class Int8Pack(KernelCandidate):
    op, name, provider = OP, "int8pack", PROVIDER

    def available(self) -> bool:
        return _int8pack_runs()

    def takes(self, problem: Problem) -> bool:
        inputs = problem.shape[1]
        return problem.format == "bfloat16" and inputs % _INT8PACK_K_MULTIPLE == 0

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> Any:
        xq, x_scale = quantize_per_token(x)
        # Unit scales: the checkpoint's scales stay float32, applied after the sums.
        ones = torch.ones(weight.shape[0], dtype=torch.bfloat16)
        sums = torch._weight_int8pack_mm(xq.bfloat16(), weight, ones)
        return scale_sums(sums, x_scale, weight_scale, x.dtype)


def register() -> None:
    """Offer the candidates and serve core::int8_linear on the CPU with the chosen one,
    unless another provider serves it already (re-entrant). The first candidate, int_mm,
    serves until the worker has measured."""
    KERNEL_CHOICES.declare_op(OP, OpTiming(_with_rows, weights_stream=True))
    for candidate in (IntMm(), Widened(), Int8Pack()):
        KERNEL_CHOICES.register(candidate)
    if CORE_OPS.provider(OP, "cpu") in (None, PROVIDER):
        CORE_OPS.register_impl(OP, "cpu", int8_linear_cpu, PROVIDER)
