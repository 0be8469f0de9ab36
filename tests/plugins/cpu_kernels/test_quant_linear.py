"""The C++ core::quant_linear kernels against core's dequantized reference, per vector ISA.

Expected values come from the packed values (core's `unpack`), W = q * scale + min rounded
once to float32, and a float64 matmul, never from the kernels. A float32 output may differ
from them only by float32 summation order (and the kernel's grouping of the sum: scale *
sum(q x) + min * sum(x) per group): at most FLOAT32_TOL of the largest |x| @ |W|^T. A
bfloat16 / float16 output is additionally rounded once, so it lies within one unit in the
last place of the exact value. On CPUs with AVX512_BF16 (and VNNI) the "avx512_bf16" ISA
multiplies bfloat16 x in its GEMMs (more than GEMV_MAX_TOKENS tokens) on int8 dot products
where W's groups are whole runs of 32 inputs (x quantized to int8 per run of 32:
`_int8_exact` is the exact value of that product) when asked, else by W rounded to bfloat16
(x times that W is the exact value), to the same tolerances. Asked to, every x86 ISA's
GEMV (up to GEMV_MAX_TOKENS tokens, any dtype) multiplies on int8 dot products too (AVX2's
integer multiply-adds), where W's groups are whole runs. The int8 dot products are
opt-in (`int8_x`; CORE_CPU_INT8_ACTIVATIONS=1 through the registered op). Past
BLOCKED_INT8_MAX_TOKENS the int8 GEMM runs where it measured faster than the strip GEMM
(`_C.quant_linear_prefill`); tests that pass `prefill` run each.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

import core.ops
from core.kernel_choice import Problem
from core.ops import quant_linear_reference
from core.ops.quant_linear import dequantize, pack, unpack

ops = pytest.importorskip(
    "core_cpu_kernels.ops", reason="core-cpu-kernels is not installed (optional plugin)"
)
from core_cpu_kernels import _C, candidates, packed_linear, weight_copies  # noqa: E402

FLOAT32_TOL = 1e-5
ALL_ISAS = ["avx512_bf16", "avx512", "avx2", "scalar"]
X86_ISAS = ALL_ISAS[:-1]  # the ISAs with the int8 GEMV
GEMV_MAX_TOKENS = 8  # the GEMV's most tokens (quant_linear.cpp): it multiplies in float32
BLOCKED_INT8_MAX_TOKENS = 64  # the int8 GEMM's most tokens before the measured choice
RUN = 32  # inputs of one int8 scale
# GEMV passes of 4 + remainders (1-7); the blocked GEMM's token blocks, full, partial and
# one vector wide, up to its last count (9-80); the strip (bf16) or tiled (float32) GEMM
# from the next (bf16 33-300; float32 81, 300).
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


ON_BF16 = pytest.mark.skipif(
    "avx512_bf16" not in _C.quant_linear_isas(), reason="this CPU has no AVX512_BF16/VNNI"
)
ON_STRIPS = pytest.mark.skipif(
    not candidates.strips_available(), reason="this CPU has no bf16 dot products (no strips)"
)


@pytest.fixture(autouse=True)
def _own_choices(choices):
    """Every test here gets its own kernel choices (conftest.py)."""


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


def _path(
    isa: str, x: torch.Tensor, packed: tuple, bits: int, prefill: str = "", int8: bool = False
) -> str:
    """How `isa` ("": the default, the widest) multiplies x: "float32" (W as it is),
    "bf16" (W rounded to bfloat16) or "int8" (x quantized per run of 32)."""
    isa = isa or _C.quant_linear_isas()[0]
    t = x.shape[0]
    qweight, scales, _ = packed
    whole_runs = qweight.shape[1] * 8 // bits // scales.shape[1] % RUN == 0
    if t <= GEMV_MAX_TOKENS:
        return "int8" if int8 and whole_runs and isa in X86_ISAS else "float32"
    if isa != "avx512_bf16" or x.dtype != torch.bfloat16:
        return "float32"
    if not (int8 and whole_runs):
        return "bf16"
    if t > BLOCKED_INT8_MAX_TOKENS and (prefill or _C.quant_linear_prefill(isa)) == "bf16":
        return "bf16"
    return "int8"


def _assert_matches(
    got: torch.Tensor,
    x: torch.Tensor,
    packed: tuple,
    bits: int,
    isa: str = "",
    prefill: str = "",
    int8: bool = False,
) -> None:
    """got = x W^T up to float32 summation order, rounded once to x's dtype (x and W
    rounded as `isa` rounds them)."""
    exact, bound = _expected(x, packed, bits, _path(isa, x, packed, bits, prefill, int8))
    assert got.dtype == x.dtype and got.shape == exact.shape
    rtol = 0.0 if x.dtype == torch.float32 else torch.finfo(x.dtype).eps
    torch.testing.assert_close(got.double(), exact, rtol=rtol, atol=FLOAT32_TOL * bound)


def _expected(x, packed: tuple, bits: int, path: str) -> tuple[torch.Tensor, float]:
    if path == "int8":
        return _int8_exact(x, *packed, bits)
    return _exact(x, *packed, bits, torch.bfloat16 if path == "bf16" else torch.float32)


def _quantized_runs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] per run of 32: (xq [T, R, 32], dx [T, R]) by the contract in
    quant_linear.h (127 / max, then a product rounded to nearest even)."""
    runs = x.float().reshape(x.shape[0], -1, RUN)
    largest = runs.abs().amax(-1, keepdim=True)
    safe = torch.where(largest > 0, largest, torch.ones_like(largest))
    inverse = torch.where(largest > 0, torch.full_like(largest, 127.0) / safe, 0.0)
    return torch.round(runs * inverse), (largest / 127).squeeze(-1)


@functools.cache
def _int8_exact(x, qweight, scales, mins, bits) -> tuple[torch.Tensor, float]:
    """x W^T in float64 as the int8 dot products define it: per run, the exact integer dot
    product of xq and q - c (c = 8 for 4-bit values, 0 for signed 8-bit ones) times scale *
    dx, plus each group's min + c * scale times x's exact sum; and the largest sum of those
    terms' magnitudes (what float32 rounds relative to)."""
    xq, dx = _quantized_runs(x)  # [T, R, 32], [T, R]
    n = qweight.shape[0]
    center = 8.0 if bits == 4 else 0.0
    q = unpack(qweight, bits).double().reshape(n, -1, RUN) - center  # [N, R, 32]
    run_group = torch.arange(q.shape[1]) * RUN // (q.shape[1] * RUN // scales.shape[1])
    scale = scales[:, run_group].double()  # [N, R]
    dots = torch.einsum("trk,nrk->tnr", xq.double(), q)
    scaled = dots * scale[None] * dx.double()[:, None, :]
    # The kernel forms min + c * scale in float32.
    shifted_min = (mins[:, run_group] + center * scales[:, run_group]).double()
    shifted = x.double().reshape(xq.shape).sum(-1)[:, None, :] * shifted_min[None]
    bound = (scaled.abs() + shifted.abs()).sum(-1).max().item()
    return (scaled + shifted).sum(-1), bound


@functools.cache
def _exact(x, qweight, scales, mins, bits, weight_dtype) -> tuple[torch.Tensor, float]:
    """x W^T in float64, and max(|x| @ |W|^T), from W as the kernels dequantize it: q *
    scale + min rounded once to float32 (an FMA; core's reference rounds the product and
    then the sum), then to `weight_dtype`. Rounding W to bfloat16 from the twice-rounded
    value instead changes some 3% of the weights by an ulp of bf16, more than the float32
    tolerance allows on the bf16 paths' sums."""
    q = unpack(qweight, bits).double()
    group = q.shape[1] // scales.shape[1]
    scale = scales.double().repeat_interleave(group, 1)
    weight = (q * scale + mins.double().repeat_interleave(group, 1)).float()
    weight = weight.to(weight_dtype).double()
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
@pytest.mark.parametrize("t", [1, 3, 7, 33, 300])  # GEMV, blocked and strip / tiled GEMM
@pytest.mark.parametrize("int8", [False, True], ids=["", "int8"])
def test_half_outputs_are_the_float32_result_rounded_once(isa, dtype, bits, t, int8):
    packed = _packed(bits, 32, 200, 576)
    x = _activations(t, 576, dtype)
    got = _C.quant_linear(x, *packed, bits, isa, int8)
    _assert_matches(got, x, packed, bits, isa, int8=int8)
    # Rounded where the exact value rounds: only float32 sums that fall on the other side
    # of a rounding boundary (measured: under 0.5% of outputs) may differ from it, by 1
    # ulp. (Rounding W to bf16 or not changes some 40% of them: this tells the two apart.)
    exact, _ = _expected(x, packed, bits, _path(isa, x, packed, bits, int8=int8))
    assert (got == exact.to(dtype)).float().mean() > 0.98


# The strip GEMM's edges: every remainder of its 6-token blocks (33-37: 3, 4, 5, 0, 1; 80:
# 2), a strip of 1-4 vectors and a partial vector (N 8, 16, 40, 200, 1000, split between
# threads at whole vectors), k a multiple of 32 or (8-bit) only of 16 (80: a last half run).
STRIP_TOKEN_COUNTS = [33, 34, 35, 36, 37, 80, 300]
STRIP_LAYOUTS = [*LAYOUTS, (8, 16, 8, 80), (8, 16, 16, 80), (4, 32, 40, 64)]


@ON_BF16
@pytest.mark.parametrize(("bits", "group", "n", "k"), STRIP_LAYOUTS)
@pytest.mark.parametrize("t", STRIP_TOKEN_COUNTS)
def test_the_strip_gemm_matches_the_bf16_reference_at_its_edges(bits, group, n, k, t):
    packed = _packed(bits, group, n, k)
    x = _activations(t, k, torch.bfloat16)
    assert _path("avx512_bf16", x, packed, bits) == "bf16"
    got = _C.quant_linear(x, *packed, bits, "avx512_bf16")
    _assert_matches(got, x, packed, bits, "avx512_bf16")


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


@ON_BF16
@pytest.mark.parametrize("prefill", ["int8", "bf16"])
@pytest.mark.parametrize(("bits", "group"), [(4, 32), (4, 64), (8, 32), (8, 16)])
@pytest.mark.parametrize("t", [65, 81, 300])
def test_both_prefill_gemms_match_their_reference(prefill, bits, group, t):
    packed = _packed(bits, group, 200, 576)
    x = _activations(t, 576, torch.bfloat16)
    got = _C.quant_linear(x, *packed, bits, "avx512_bf16", True, prefill)
    _assert_matches(got, x, packed, bits, "avx512_bf16", prefill, int8=True)


def test_the_prefill_choice_is_a_gemm_the_isa_has():
    for isa in _C.quant_linear_isas():
        want = {"int8", "bf16"} if isa == "avx512_bf16" else {"bf16"}
        assert _C.quant_linear_prefill(isa) in want


def test_an_unknown_prefill_gemm_is_refused_by_name():
    qweight, scales, mins = _packed(4, 32, 8, 64)
    with pytest.raises(RuntimeError, match="prefill must be .* got 'amx'"):
        x = _activations(1, 64, torch.float32)
        _C.quant_linear(x, qweight, scales, mins, 4, "", True, "amx")


@ON_BF16
@pytest.mark.parametrize("bits", [4, 8])
def test_int8_x_rounds_half_to_even_and_an_all_zero_run_gives_zeros(bits):
    # W [64, 64] picks input n for output n (scale 1; q - 8 = 1 and min -8 for 4-bit, which
    # the kernel counts from 8; q = 1 and min 0 for 8-bit), so each output is dx * xq of
    # its input, here xq itself: run 0's largest |x| is 127 (dx = 1).
    halves = [0.5, 1.5, 2.5, -0.5, -2.5, 3.5]
    run0 = torch.tensor([127.0, *halves, *range(-12, 13)])
    x = torch.cat([run0, torch.zeros(RUN)]).bfloat16().expand(9, -1).contiguous()
    center = 8 if bits == 4 else 0
    qweight = pack(torch.eye(64, dtype=torch.int64) + center, bits)
    ones, mins = torch.ones(64, 2), torch.full((64, 2), -float(center))
    got = _C.quant_linear(x, qweight, ones, mins, bits, "avx512_bf16", True)
    want = torch.tensor([127.0, 0, 2, 2, 0, -2, 4, *range(-12, 13), *[0.0] * RUN])
    assert torch.equal(got.float(), want.expand(9, -1))


@ON_BF16
def test_int8_x_errs_by_at_most_half_a_step_of_each_run():
    # The contract's bound (core/ops/quant_linear.py): each x moves by at most
    # max |x[run]| / 254, so an output by that times sum |scale * (q - 8)| over the run
    # (4-bit values counted from 8), summed.
    qweight, scales, mins = _packed(4, 32, 200, 576)
    x = _activations(40, 576, torch.bfloat16).clone()
    x[:, 100] = 60.0  # an outlier channel, as LLM activations have
    got = _C.quant_linear(x, qweight, scales, mins, 4, "avx512_bf16", True).double()
    weight = dequantize(qweight, scales, mins, 4).double()
    centered = dequantize(qweight, scales, -8 * scales, 4).double()  # scale * (q - 8)
    step = x.double().reshape(40, -1, RUN).abs().amax(-1) / 254  # [T, R]
    bound = step @ centered.abs().reshape(200, -1, RUN).sum(-1).T  # [T, N]
    exact = x.double() @ weight.T
    rounding = exact.abs() * 2**-8 + 1e-5 * (x.double().abs() @ weight.abs().T)
    assert ((got - exact).abs() <= bound + rounding).all()
    assert ((got - exact).abs() > rounding).any()  # the int8 error is there to bound


X86 = [_isa(name) for name in X86_ISAS]
GEMV_TOKEN_COUNTS = [1, 2, 3, 4, 5, 7, 8]  # passes of 4 tokens and every remainder


@pytest.mark.parametrize("isa", X86)
@pytest.mark.parametrize(("bits", "group", "n", "k"), [lay for lay in LAYOUTS if lay[1] % RUN == 0])
@pytest.mark.parametrize("t", GEMV_TOKEN_COUNTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_int8_gemv_matches_the_int8_reference(isa, bits, group, n, k, t, dtype):
    packed = _packed(bits, group, n, k)
    x = _activations(t, k, dtype)
    assert _path(isa, x, packed, bits, int8=True) == "int8"
    got = _C.quant_linear(x, *packed, bits, isa, True)
    _assert_matches(got, x, packed, bits, isa, int8=True)


def test_the_int8_gemv_leaves_groups_of_16_to_the_float32_gemv():
    packed = _packed(8, 16, 40, 96)
    x = _activations(3, 96, torch.float32)
    assert _path("", x, packed, 8, int8=True) == "float32"
    _assert_matches(_C.quant_linear(x, *packed, 8, "", True), x, packed, 8)


@pytest.mark.parametrize("isa", X86)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("t", [1, 2, 5, 8])
def test_the_int8_gemv_rounds_half_to_even_and_an_all_zero_run_gives_zeros(isa, bits, t):
    # As the GEMM's test above: output n is dx * xq of input n, here xq itself (dx = 1),
    # exactly, in float32 x.
    halves = [0.5, 1.5, 2.5, -0.5, -2.5, 3.5]
    run0 = torch.tensor([127.0, *halves, *range(-12, 13)])
    x = torch.cat([run0, torch.zeros(RUN)]).expand(t, -1).contiguous()
    center = 8 if bits == 4 else 0
    qweight = pack(torch.eye(64, dtype=torch.int64) + center, bits)
    ones, mins = torch.ones(64, 2), torch.full((64, 2), -float(center))
    got = _C.quant_linear(x, qweight, ones, mins, bits, isa, True)
    want = torch.tensor([127.0, 0, 2, 2, 0, -2, 4, *range(-12, 13), *[0.0] * RUN])
    assert torch.equal(got, want.expand(t, -1))


@pytest.mark.parametrize("isa", X86)
def test_the_int8_gemv_errs_by_at_most_half_a_step_of_each_run(isa):
    qweight, scales, mins = _packed(4, 32, 200, 576)
    x = _activations(8, 576, torch.float32).clone()
    x[:, 100] = 60.0  # an outlier channel, as LLM activations have
    got = _C.quant_linear(x, qweight, scales, mins, 4, isa, True).double()
    weight = dequantize(qweight, scales, mins, 4).double()
    centered = dequantize(qweight, scales, -8 * scales, 4).double()  # scale * (q - 8)
    step = x.double().reshape(8, -1, RUN).abs().amax(-1) / 254  # [T, R]
    bound = step @ centered.abs().reshape(200, -1, RUN).sum(-1).T  # [T, N]
    exact = x.double() @ weight.T
    rounding = 1e-5 * (x.double().abs() @ weight.abs().T)
    assert ((got - exact).abs() <= bound + rounding).all()
    assert ((got - exact).abs() > rounding).any()  # the int8 error is there to bound


@pytest.mark.parametrize("env", ["", "0", "1"])
@pytest.mark.parametrize("t", [1, 33], ids=["GEMV", "GEMM"])
def test_int8_activations_are_opt_in_through_the_environment(env, t, monkeypatch):
    monkeypatch.setenv("CORE_CPU_INT8_ACTIVATIONS", env)
    assert candidates.int8_activations() is (env == "1")
    packed = _packed(4, 32, 200, 576)
    x = _activations(t, 576, torch.bfloat16)
    got = ops.quant_linear(x, *packed, 4)
    _assert_matches(got, x, packed, 4, int8=env == "1")


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
        bf16_tier = {"avx512_bf16", "avx512_vnni"} <= flags
        want += ["avx512_bf16", "avx512"] if bf16_tier else ["avx512"]
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


# ---- Strips: W dequantized once to bf16 in the strip GEMM's layout --------------------------
#
# The layout is checked against W built here from the packed values (q * scale + min rounded
# once to float32, then to bfloat16); products against `_exact` with W in bfloat16.

STRIP_ROWS = 64  # rows per strip (quant_linear.h's kStripRows)


def _assert_bf16(got: torch.Tensor, x: torch.Tensor, packed: tuple, bits: int) -> None:
    """got = x W^T with W rounded to bfloat16, up to float32 summation order, rounded once."""
    exact, bound = _exact(x, *packed, bits, torch.bfloat16)
    rtol = torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(got.double(), exact, rtol=rtol, atol=FLOAT32_TOL * bound)


def _weight_bf16(qweight, scales, mins, bits) -> torch.Tensor:
    q = unpack(qweight, bits).double()
    group = q.shape[1] // scales.shape[1]
    weight = q * scales.double().repeat_interleave(group, 1)
    return (weight + mins.double().repeat_interleave(group, 1)).float().bfloat16()


@ON_BF16
@pytest.mark.parametrize(("bits", "group", "n", "k"), STRIP_LAYOUTS)
def test_strips_hold_w_in_bf16_a_strip_of_64_rows_at_a_time_in_pairs_of_inputs(bits, group, n, k):
    packed = _packed(bits, group, n, k)
    strips = _C.quant_linear_strips(*packed, bits)
    num_strips = -(-n // STRIP_ROWS)
    padded = torch.zeros(num_strips * STRIP_ROWS, k, dtype=torch.bfloat16)
    padded[:n] = _weight_bf16(*packed, bits)
    # strip s, pair j, row r, input i of the pair: W[64 s + r, 2 j + i]
    want = padded.view(num_strips, STRIP_ROWS, k // 2, 2).transpose(1, 2)
    assert strips.dtype == torch.bfloat16
    assert torch.equal(strips.view(num_strips, k // 2, STRIP_ROWS, 2), want)


# Every remainder of the 6-token register blocks (1-7, 33-37), decode and prefill sizes.
TOKENS = [1, 2, 3, 4, 5, 6, 7, 9, 33, 34, 35, 36, 37, 80, 300]


@ON_BF16
@pytest.mark.parametrize(("bits", "group", "n", "k"), STRIP_LAYOUTS)
@pytest.mark.parametrize("t", TOKENS)
@pytest.mark.parametrize("threads", [1, 3])  # 3: shares that start inside a strip
def test_multiplying_from_strips_matches_the_bf16_reference(bits, group, n, k, t, threads):
    packed = _packed(bits, group, n, k)
    strips = _C.quant_linear_strips(*packed, bits)
    x = _activations(t, k, torch.bfloat16)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = _C.quant_linear(x, *packed, bits, strips=strips)
    finally:
        torch.set_num_threads(before)
    _assert_bf16(got, x, packed, bits)


@ON_BF16
def test_strips_of_another_weight_are_refused():
    packed = _packed(4, 32, 200, 576)
    other = _C.quant_linear_strips(*_packed(4, 32, 40, 576), 4)
    with pytest.raises(RuntimeError, match="quant_linear_strips of this weight"):
        _C.quant_linear(_activations(9, 576, torch.bfloat16), *packed, 4, strips=other)


@ON_BF16
def test_an_isa_without_bf16_dot_products_makes_no_strips():
    packed = _packed(4, 32, 40, 64)
    with pytest.raises(RuntimeError, match="ISA avx512 has no bf16 dot products"):
        _C.quant_linear_strips(*packed, 4, "avx512")


def _interleaved(packed: tuple, bits: int = 4) -> torch.Tensor:
    return _C.quant_linear_interleaved(*packed, bits, "avx512_bf16")


@ON_STRIPS
@pytest.mark.parametrize(("bits", "group", "n", "k"), LAYOUTS)  # N cuts a partial last block
@pytest.mark.parametrize("t", [1, 2, 3, 4, 5, 7, 8])
def test_the_interleaved_gemv_matches_the_float32_reference(bits, group, n, k, t):
    packed = _packed(bits, group, n, k)
    x = _activations(t, k, torch.bfloat16)
    got = _C.quant_linear(x, *packed, bits, "avx512_bf16", interleaved=_interleaved(packed, bits))
    _assert_matches(got, x, packed, bits, "avx512_bf16")


@ON_STRIPS
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("t", [1, 8, 9, 33])
def test_decode_rows_are_multiplied_from_the_interleaved_copy_and_more_rows_from_w(bits, t):
    packed = _packed(bits, 32, 200, 576)
    x = _activations(t, 576, torch.bfloat16)
    # A zeroed copy holds zero scales and mins: every output it gives is 0.
    blank = torch.zeros_like(_interleaved(packed, bits))
    got = _C.quant_linear(x, *packed, bits, "avx512_bf16", interleaved=blank)
    if t <= GEMV_MAX_TOKENS:
        assert not got.any()
    else:
        assert torch.equal(got, _C.quant_linear(x, *packed, bits, "avx512_bf16"))


@ON_STRIPS
def test_an_interleaved_copy_of_another_layout_is_refused():
    packed = _packed(4, 32, 200, 576)
    x = _activations(1, 576, torch.bfloat16)
    # Larger groups (fewer scales), and 8-bit values (twice the bytes).
    for bits, group in [(4, 64), (8, 32)]:
        other = _interleaved(_packed(bits, group, 200, 576), bits)
        with pytest.raises(RuntimeError, match="quant_linear_interleaved of this weight"):
            _C.quant_linear(x, *packed, 4, "avx512_bf16", interleaved=other)
    with pytest.raises(RuntimeError, match="one copy of W at a time"):
        _C.quant_linear(x, *packed, 4, "avx512_bf16", interleaved=_interleaved(packed),
                        strips=_C.quant_linear_strips(*packed, 4))  # fmt: skip


@ON_STRIPS
def test_the_interleaved_kernel_lays_a_weight_out_once(monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "quant_linear=interleaved")
    builds = []
    real = _C.quant_linear_interleaved
    monkeypatch.setattr(
        ops._C, "quant_linear_interleaved", lambda q, *a: builds.append(q.shape[0]) or real(q, *a)
    )
    packed = tuple(t.clone() for t in _packed(4, 32, 200, 576))
    for t in (1, 4, 33):
        x = _activations(t, 576, torch.bfloat16)
        _assert_matches(ops.quant_linear(x, *packed, 4), x, packed, 4)
    assert builds == [200]


@pytest.mark.parametrize(
    ("fmt", "int8", "takes"),
    [("q4/bfloat16", "", True), ("q8/bfloat16", "", True), ("q4/float32", "", False),
     ("q8/float32", "", False), ("q4/bfloat16", "1", False)],
    ids=["4-bit bf16 x", "8-bit bf16 x", "4-bit float32 x", "8-bit float32 x", "int8 activations"],
)  # fmt: skip
def test_the_interleaved_kernel_takes_bf16_activations(fmt, int8, takes, monkeypatch):
    monkeypatch.setenv("CORE_CPU_INT8_ACTIVATIONS", int8)
    problem = Problem("quant_linear", fmt, (200, 576))
    assert candidates.Interleaved().takes(problem) is takes


def _strip_builds(monkeypatch) -> list[int]:
    calls = []
    real = _C.quant_linear_strips

    def spy(qweight, *args):
        calls.append(qweight.shape[0])
        return real(qweight, *args)

    monkeypatch.setattr(ops._C, "quant_linear_strips", spy)
    return calls


@ON_STRIPS
def test_the_strip_kernel_builds_a_weights_strips_once(monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "quant_linear=strips")
    builds = _strip_builds(monkeypatch)
    qweight, scales, mins = (t.clone() for t in _packed(4, 32, 200, 576))
    for t in (1, 33, 300):
        x = _activations(t, 576, torch.bfloat16)
        _assert_bf16(ops.quant_linear(x, qweight, scales, mins, 4), x, (qweight, scales, mins), 4)
    assert builds == [200]


@pytest.mark.parametrize(
    ("dtype", "int8", "takes"),
    [
        (torch.bfloat16, "", True),
        (torch.float32, "", False),
        (torch.float16, "", False),
        (torch.bfloat16, "1", False),
    ],
    ids=["bf16 x", "float32 x", "float16 x", "int8 activations"],
)
def test_strips_take_bf16_activations_unless_int8_ones_are_asked_for(
    dtype, int8, takes, monkeypatch
):
    monkeypatch.setenv("CORE_CPU_INT8_ACTIVATIONS", int8)
    qweight, _, _ = _packed(4, 32, 200, 576)
    problem = candidates.quant_linear_problem(_activations(1, 576, dtype), qweight, 4)
    assert candidates.Strips().takes(problem) is takes


@ON_STRIPS
@pytest.mark.parametrize(
    ("dtype", "int8"),
    [(torch.float32, ""), (torch.bfloat16, "1")],
    ids=["float32 x", "int8 activations"],
)
def test_a_forced_strip_kernel_leaves_what_it_does_not_take_to_the_packed_kernels(
    dtype, int8, monkeypatch
):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "quant_linear=strips")
    monkeypatch.setenv("CORE_CPU_INT8_ACTIVATIONS", int8)
    builds = _strip_builds(monkeypatch)
    packed = tuple(t.clone() for t in _packed(4, 32, 200, 576))
    x = _activations(33, 576, dtype)
    _assert_matches(ops.quant_linear(x, *packed, 4), x, packed, 4, int8=bool(int8))
    assert builds == []


def _copying_kernel(name: str):
    """A pytest param for a candidate that keeps a copy of W, skipped where it cannot run
    here; bf16 x for the strips (all they take), float32 x for the dequantized copies."""
    runs = {
        "strips": candidates.strips_available(),
        "interleaved": candidates.strips_available(),
        "dequantized": True,
        "dequantized-onednn": packed_linear.available(),
    }[name]
    return pytest.param(name, marks=pytest.mark.skipif(not runs, reason=f"no {name} here"))


@pytest.mark.parametrize(
    "kernel",
    [_copying_kernel(n) for n in ("strips", "interleaved", "dequantized", "dequantized-onednn")],
)
@pytest.mark.parametrize("written", ["qweight", "scales", "mins"])
def test_a_weight_written_in_place_is_multiplied_as_it_is_now(kernel, written, monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", f"quant_linear={kernel}")
    qweight, scales, mins = (t.clone() for t in _packed(4, 32, 200, 576))
    dtype = torch.bfloat16 if kernel in ("strips", "interleaved") else torch.float32
    x = _activations(3 if kernel == "interleaved" else 33, 576, dtype)  # its decode rows
    ops.quant_linear(x, qweight, scales, mins, 4)
    tensor = {"qweight": qweight, "scales": scales, "mins": mins}[written]
    tensor.copy_(tensor.flip(0))  # another row's values (qweight: still in range)
    got = ops.quant_linear(x, qweight, scales, mins, 4)
    if kernel == "strips":
        _assert_bf16(got, x, (qweight, scales, mins), 4)
    else:
        _assert_matches(got, x, (qweight, scales, mins), 4)


@ON_STRIPS
def test_past_the_memory_budget_the_strip_kernel_dequantizes_as_it_multiplies(monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "quant_linear=strips")
    builds = _strip_builds(monkeypatch)
    monkeypatch.setattr(weight_copies, "max_bytes", lambda: weight_copies.copied_bytes())
    packed = tuple(t.clone() for t in _packed(4, 32, 200, 576))
    x = _activations(33, 576, torch.bfloat16)
    _assert_matches(ops.quant_linear(x, *packed, 4), x, packed, 4)
    assert builds == []
