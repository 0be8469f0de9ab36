"""The C++ core::quant_linear kernels against core's dequantized reference, per vector ISA.

Expected values come from core's `dequantize` and a float64 matmul, never from the
kernels. A float32 output may differ from them only by float32 summation order (and the
kernel's grouping of the sum: scale * sum(q x) + min * sum(x) per group): at most
FLOAT32_TOL of the largest |x| @ |W|^T. A bfloat16 / float16 output is additionally rounded
once, so it lies within one unit in the last place of the exact value. On CPUs with
AVX512_BF16 the "avx512_bf16" ISA multiplies bfloat16 x in its GEMMs (more than
GEMV_MAX_TOKENS tokens) by W rounded to bfloat16, so there the exact value is x times W
rounded to bfloat16, to the same tolerances.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

import core.ops
from core.ops import quant_linear_reference
from core.ops.quant_linear import dequantize, pack

ops = pytest.importorskip(
    "core_cpu_kernels.ops", reason="core-cpu-kernels is not installed (optional plugin)"
)
from core_cpu_kernels import _C  # noqa: E402  (after the skip: the module needs the plugin)

FLOAT32_TOL = 1e-5
ALL_ISAS = ["avx512_bf16", "avx512", "avx2", "scalar"]
GEMV_MAX_TOKENS = 8  # the GEMV's most tokens (quant_linear.cpp): it multiplies in float32
# GEMV passes of 4 + remainders (1-7); the blocked GEMM's token blocks, full, partial and
# one vector wide, up to its last count (9-80); the tiled GEMM from the next (81, 300).
TOKEN_COUNTS = [1, 2, 3, 5, 7, 9, 16, 24, 33, 80, 81, 300]
# (bits, group size, N, K): every group size each width allows, odd N, K not a power of 2.
LAYOUTS = [
    (4, 32, 1000, 96),
    (4, 64, 200, 576),
    (4, 128, 40, 1536),
    (8, 16, 40, 96),
    (8, 32, 1000, 96),
    (8, 64, 200, 576),
    (8, 128, 40, 1536),
]


def _isa(name: str):
    """A pytest param for one ISA, skipped (with the reason) where this CPU lacks it."""
    available = _C.quant_linear_isas()
    reason = f"this CPU runs only {available}"
    return pytest.param(name, marks=pytest.mark.skipif(name not in available, reason=reason))


ISAS = [_isa(name) for name in ALL_ISAS]


@functools.cache  # each ISA's test of a layout multiplies the same inputs
def _packed(bits: int, group: int, n: int, k: int, seed: int = 0):
    """A random packed weight: AWQ-like scales and zero points (mins = -zero * scale)."""
    gen = torch.Generator().manual_seed(seed)
    low, high = (0, 16) if bits == 4 else (-128, 128)
    q = torch.randint(low, high, (n, k), generator=gen)
    scales = torch.rand(n, k // group, generator=gen) * 0.02 + 1e-3
    zeros = torch.randint(0, 16, (n, k // group), generator=gen).float()
    return pack(q, bits), scales, -zeros * scales


@functools.cache
def _activations(t: int, k: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    return (torch.randn(t, k, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype)


def _weight_dtype(isa: str, x: torch.Tensor) -> torch.dtype:
    """What W is rounded to before `isa` ("": the default, the widest) multiplies x."""
    bf16_dot = (isa or _C.quant_linear_isas()[0]) == "avx512_bf16" and x.dtype == torch.bfloat16
    return torch.bfloat16 if bf16_dot and x.shape[0] > GEMV_MAX_TOKENS else torch.float32


def _assert_matches(
    got: torch.Tensor, x: torch.Tensor, packed: tuple, bits: int, isa: str = ""
) -> None:
    """got = x W^T up to float32 summation order, rounded once to x's dtype (W rounded
    as `isa` rounds it)."""
    exact, bound = _exact(x, *packed, bits, _weight_dtype(isa, x))
    assert got.dtype == x.dtype and got.shape == exact.shape
    rtol = 0.0 if x.dtype == torch.float32 else torch.finfo(x.dtype).eps
    torch.testing.assert_close(got.double(), exact, rtol=rtol, atol=FLOAT32_TOL * bound)


@functools.cache
def _exact(x, qweight, scales, mins, bits, weight_dtype) -> tuple[torch.Tensor, float]:
    """x W^T in float64 from core's dequantized W (rounded to `weight_dtype`), and
    max(|x| @ |W|^T)."""
    weight = dequantize(qweight, scales, mins, bits).to(weight_dtype).double()
    return x.double() @ weight.T, (x.double().abs() @ weight.abs().T).max().item()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("bits", "group", "n", "k"), LAYOUTS)
@pytest.mark.parametrize("t", TOKEN_COUNTS)
def test_float32_output_matches_the_dequantized_reference(isa, bits, group, n, k, t):
    qweight, scales, mins = _packed(bits, group, n, k)
    x = _activations(t, k, torch.float32)
    got = _C.quant_linear(x, qweight, scales, mins, bits, isa)
    _assert_matches(got, x, (qweight, scales, mins), bits, isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("t", [1, 3, 7, 33, 300])  # GEMV, blocked and tiled GEMM
def test_half_outputs_are_the_float32_result_rounded_once(isa, dtype, bits, t):
    qweight, scales, mins = _packed(bits, 32, 200, 576)
    x = _activations(t, 576, dtype)
    got = _C.quant_linear(x, qweight, scales, mins, bits, isa)
    _assert_matches(got, x, (qweight, scales, mins), bits, isa)
    # Rounded where the exact value rounds: only float32 sums that fall on the other side
    # of a rounding boundary (measured: under 0.5% of outputs) may differ from it, by 1
    # ulp. (Rounding W to bf16 or not changes some 40% of them: this tells the two apart.)
    exact, _ = _exact(x, qweight, scales, mins, bits, _weight_dtype(isa, x))
    assert (got == exact.to(dtype)).float().mean() > 0.98


@pytest.mark.parametrize("t", [1, 4, 256])
def test_a_smollm2_sized_layer_matches_the_reference(t):
    qweight, scales, mins = _packed(4, 32, 1536, 576)  # SmolLM2-135M's gate / up projection
    x = _activations(t, 576, torch.float32)
    got = ops.quant_linear(x, qweight, scales, mins, 4)
    _assert_matches(got, x, (qweight, scales, mins), 4)


@pytest.mark.parametrize("t", [1, 33])
def test_strided_activations_are_read_as_their_values(t):
    qweight, scales, mins = _packed(4, 32, 40, 96)
    wide = _activations(t, 2 * 96, torch.bfloat16)
    x = wide[:, ::2]  # [T, K] with a stride of 2 between inputs
    assert not x.is_contiguous()
    got = ops.quant_linear(x, qweight, scales, mins, 4)
    _assert_matches(got, x, (qweight, scales, mins), 4)


@pytest.mark.parametrize("t", [1, 33])
def test_inference_mode_tensors_are_multiplied_like_any_other(t):
    # The model runner multiplies under inference mode; the GEMM's worker threads must
    # run in it too, or writing their tiles of the (inference) output is refused.
    qweight, scales, mins = _packed(4, 32, 200, 576)
    x = _activations(t, 576, torch.float32)
    with torch.inference_mode():
        got = ops.quant_linear(x.clone(), qweight, scales, mins, 4)
    _assert_matches(got, x, (qweight, scales, mins), 4)


def _untaken():
    qweight, scales, mins = _packed(4, 32, 8, 64)
    x = _activations(3, 64, torch.float32)
    strided_qweight = qweight.t().contiguous().t()  # same values, column-major
    return {
        "float64 x": (x.double(), qweight, scales, mins),
        "3-D x": (x[None], qweight, scales, mins),
        "column-major qweight": (x, strided_qweight, scales, mins),
        "strided scales": (x, qweight, scales.t().contiguous().t(), mins),
    }


@pytest.mark.parametrize("case", sorted(_untaken()))
def test_inputs_the_kernel_does_not_take_get_the_reference_exactly(case):
    args = _untaken()[case]
    assert torch.equal(ops.quant_linear(*args, 4), quant_linear_reference(*args, 4))


def test_no_tokens_give_an_empty_output():
    qweight, scales, mins = _packed(8, 16, 40, 96)
    got = ops.quant_linear(torch.empty(0, 96, dtype=torch.bfloat16), qweight, scales, mins, 8)
    assert got.shape == (0, 40) and got.dtype == torch.bfloat16


def test_groups_that_do_not_cut_whole_runs_are_refused():
    qweight, _, _ = _packed(4, 32, 8, 64)
    scales = mins = torch.ones(8, 4)  # groups of 16 inputs: 4-bit runs are 32 long
    with pytest.raises(RuntimeError, match="4 groups do not cut 64 inputs"):
        ops.quant_linear(_activations(1, 64, torch.float32), qweight, scales, mins, 4)


def test_an_isa_this_cpu_lacks_is_refused_by_name():
    qweight, scales, mins = _packed(4, 32, 8, 64)
    with pytest.raises(RuntimeError, match="isa 'avx1024' is not available"):
        _C.quant_linear(_activations(1, 64, torch.float32), qweight, scales, mins, 4, "avx1024")


@pytest.mark.skipif(sys.platform != "linux", reason="reads the CPU flags from /proc/cpuinfo")
def test_the_probed_isas_are_those_the_cpu_flags_name():
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    want = []
    if {"avx2", "fma"} <= flags and {"avx512f", "avx512bw", "avx512vl"} <= flags:
        want += ["avx512_bf16", "avx512"] if "avx512_bf16" in flags else ["avx512"]
    if {"avx2", "fma"} <= flags:
        want.append("avx2")
    assert _C.quant_linear_isas() == [*want, "scalar"]  # widest first: the default


def test_register_serves_the_core_op_on_the_cpu():
    ops.register()
    assert core.ops.providers()["quant_linear"]["cpu"] == ops.PROVIDER == "core-cpu-kernels"
    qweight, scales, mins = _packed(8, 32, 40, 96)
    x = _activations(2, 96, torch.float32)
    got = torch.ops.core.quant_linear(x, qweight, scales, mins, 8)  # through the dispatcher
    _assert_matches(got, x, (qweight, scales, mins), 8)
