"""The Triton multi-LoRA kernels against a per-token float64 loop, run by Triton's interpreter.

The interpreter replaces compilation when TRITON_INTERPRET=1 at the moment `@triton.jit`
decorates the kernel, so the tests load a private copy of the kernel module with the variable
set (independent of any copy already imported). On a CUDA machine the same parity checks also
run compiled. The kernels compute in float32 whatever the activation dtype, so bf16 is checked
in the interpreter too: it cannot compute on bf16 values, but it converts them to float32
exactly (and back by truncation, see `_interpreted_rounding`).
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from triton_interpreted import load_interpreted

pytest.importorskip("core_lora", reason="core-lora is not installed (optional plugin)")
# Imported here, before any TRITON_INTERPRET is set: triton decorates its own @jit helpers at
# import, and interpreted ones would break every compiled kernel later in this process.
pytest.importorskip("triton", reason="triton is not installed (the LoRA GPU kernel needs it)")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FP32_SUM_ORDER = 1e-5  # relative to max(|A| @ |x|) or max(|s| @ |B|): fp32 summation order
NUM_SLOTS = 3
# in: two K tiles of 64, the second one partial; W: 3 shards of rank 8, short of a 32 tile;
# out: one full and one partial tile of 64.
IN_FEATURES, WIDTH, OUT_FEATURES = 80, 24, 72


@pytest.fixture(scope="module")
def interpreted() -> ModuleType:
    """A private copy of `core_lora.triton_lora` whose kernel runs in the interpreter."""
    return load_interpreted("core_lora.triton_lora")


def _randn(*shape, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def _mixed_slots(num_tokens, device="cpu"):
    """Every slot and -1 interleaved: 1, 2, -1, 0, 1, 2, -1, 0, ..."""
    return torch.tensor(
        [(5 * t + 2) % (NUM_SLOTS + 1) - 1 for t in range(num_tokens)], device=device
    )


def _reference_shrink(x, lora_a, token_slots):
    """float64 [T, W]: one matrix-vector product per token, zero rows for slot -1."""
    s = torch.zeros(x.shape[0], lora_a.shape[1], dtype=torch.float64)
    for t, slot in enumerate(token_slots.tolist()):
        if slot >= 0:
            s[t] = lora_a[slot].double().cpu() @ x[t].double().cpu()
    return s


def _reference_delta(s, lora_b, token_slots):
    """float64 [T, out]: one vector-matrix product per token, zero rows for slot -1."""
    delta = torch.zeros(s.shape[0], lora_b.shape[2], dtype=torch.float64)
    for t, slot in enumerate(token_slots.tolist()):
        if slot >= 0:
            delta[t] = s[t].double().cpu() @ lora_b[slot].double().cpu()
    return delta


def _assert_shrink_matches_reference(s, x, lora_a, token_slots):
    """Within fp32 summation order: the products of any activation dtype are exact in fp32."""
    ref = _reference_shrink(x, lora_a, token_slots)
    magnitude = torch.einsum("lwi,ti->tlw", lora_a.double().abs().cpu(), x.double().abs().cpu())
    assert s.dtype == torch.float32
    assert s.shape == ref.shape
    error = (s.double().cpu() - ref).abs().max()
    assert error <= FP32_SUM_ORDER * magnitude.max(), f"error {error:.3g}"


def _interpreted_rounding(dtype):
    """The relative error of one float32 -> dtype conversion under the interpreter: half an
    ulp (round to nearest even, as compiled), except a whole ulp for bfloat16, which the
    interpreter truncates."""
    eps = torch.finfo(dtype).eps
    return eps if dtype == torch.bfloat16 else eps / 2


def _assert_expand_matches_reference(y_after, y_before, s, lora_b, token_slots, rounding=None):
    """Within fp32 summation order plus one rounding of y_before + s @ B to y's dtype
    (relative error `rounding`, by default the interpreter's)."""
    ref = y_before.double().cpu() + _reference_delta(s, lora_b, token_slots)
    magnitude = torch.einsum("tw,lwo->tlo", s.double().abs().cpu(), lora_b.double().abs().cpu())
    rounding = _interpreted_rounding(y_after.dtype) if rounding is None else rounding
    bound = FP32_SUM_ORDER * magnitude.max() + rounding * ref.abs()
    assert y_after.dtype == y_before.dtype
    excess = (y_after.double().cpu() - ref).abs() - bound
    assert (excess <= 0).all(), f"exceeds the bound by up to {excess.max().item():.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 3, 17, 64])
def test_shrink_matches_reference_for_mixed_slots(interpreted, num_tokens, dtype):
    x = _randn(num_tokens, IN_FEATURES, dtype=dtype, seed=1)
    lora_a = _randn(NUM_SLOTS, WIDTH, IN_FEATURES, dtype=dtype, seed=2)
    token_slots = _mixed_slots(num_tokens)
    s = interpreted.lora_shrink(x, lora_a, token_slots)
    _assert_shrink_matches_reference(s, x, lora_a, token_slots)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 3, 17, 64])
def test_expand_adds_to_y_for_mixed_slots(interpreted, num_tokens, dtype):
    s = _randn(num_tokens, WIDTH, seed=1)
    lora_b = _randn(NUM_SLOTS, WIDTH, OUT_FEATURES, dtype=dtype, seed=2)
    y = _randn(num_tokens, OUT_FEATURES, dtype=dtype, seed=3)
    y_before = y.clone()
    token_slots = _mixed_slots(num_tokens)
    interpreted.lora_expand(s, lora_b, token_slots, y)
    _assert_expand_matches_reference(y, y_before, s, lora_b, token_slots)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tokens_without_slot_leave_y_bit_identical(interpreted, dtype):
    x = _randn(17, IN_FEATURES, dtype=dtype, seed=1)
    lora_a = _randn(NUM_SLOTS, WIDTH, IN_FEATURES, dtype=dtype, seed=2)
    lora_b = _randn(NUM_SLOTS, WIDTH, OUT_FEATURES, dtype=dtype, seed=3)
    y = _randn(17, OUT_FEATURES, dtype=dtype, seed=4)
    y_before = y.clone()
    token_slots = _mixed_slots(17)
    base_only = token_slots == -1
    interpreted.lora_apply(x, lora_a, lora_b, token_slots, y)
    assert torch.equal(y[base_only], y_before[base_only])
    assert not torch.equal(y[~base_only], y_before[~base_only])
    s = interpreted.lora_shrink(x, lora_a, token_slots)
    assert torch.equal(s[base_only], torch.zeros_like(s[base_only]))


def test_slots_outside_the_buffers_count_as_no_slot(interpreted):
    x = _randn(4, IN_FEATURES, seed=1)
    lora_a = _randn(NUM_SLOTS, WIDTH, IN_FEATURES, seed=2)
    lora_b = _randn(NUM_SLOTS, WIDTH, OUT_FEATURES, seed=3)
    y = _randn(4, OUT_FEATURES, seed=4)
    y_before = y.clone()
    token_slots = torch.tensor([NUM_SLOTS, 0, -2, NUM_SLOTS + 5])
    interpreted.lora_apply(x, lora_a, lora_b, token_slots, y)
    assert torch.equal(y[[0, 2, 3]], y_before[[0, 2, 3]])
    _assert_expand_matches_reference(
        y[1:2], y_before[1:2], x[1:2] @ lora_a[0].T, lora_b, torch.tensor([0])
    )


def test_one_slot_for_all_tokens_equals_dense_matmul(interpreted):
    # 80 tokens in one slot: two row tiles of 64, the second one partial.
    x = _randn(80, IN_FEATURES, seed=1)
    lora_a = _randn(NUM_SLOTS, WIDTH, IN_FEATURES, seed=2)
    lora_b = _randn(NUM_SLOTS, WIDTH, OUT_FEATURES, seed=3)
    y = _randn(80, OUT_FEATURES, seed=4)
    dense = (y.double() + x.double() @ lora_a[1].double().T @ lora_b[1].double()).float()
    interpreted.lora_apply(x, lora_a, lora_b, torch.full((80,), 1), y)
    torch.testing.assert_close(y, dense, atol=FP32_SUM_ORDER * dense.abs().max(), rtol=0)


def test_kernels_read_strided_views_and_write_only_their_columns(interpreted):
    x = _randn(5, 2 * IN_FEATURES, seed=1)[:, ::2]  # [5, 80], stride 2 along in
    lora_a = _randn(NUM_SLOTS, WIDTH, IN_FEATURES, seed=2)
    lora_b = _randn(NUM_SLOTS, WIDTH, OUT_FEATURES, seed=3)
    buffer = _randn(5, OUT_FEATURES + 8, seed=4)  # y: the first 72 columns of a wider output
    buffer_before = buffer.clone()
    token_slots = _mixed_slots(5)
    interpreted.lora_apply(x, lora_a, lora_b, token_slots, buffer[:, :OUT_FEATURES])
    assert torch.equal(buffer[:, OUT_FEATURES:], buffer_before[:, OUT_FEATURES:])
    s = _reference_shrink(x, lora_a, token_slots).float()
    _assert_expand_matches_reference(
        buffer[:, :OUT_FEATURES], buffer_before[:, :OUT_FEATURES], s, lora_b, token_slots
    )


def test_empty_batch_is_a_no_op(interpreted):
    lora_a = _randn(NUM_SLOTS, WIDTH, IN_FEATURES, seed=2)
    lora_b = _randn(NUM_SLOTS, WIDTH, OUT_FEATURES, seed=3)
    y = torch.zeros(0, OUT_FEATURES)
    s = interpreted.lora_shrink(torch.zeros(0, IN_FEATURES), lora_a, torch.zeros(0, dtype=int))
    interpreted.lora_expand(s, lora_b, torch.zeros(0, dtype=int), y)
    assert s.shape == (0, WIDTH)


def _apply_args():
    return {
        "x": torch.zeros(3, IN_FEATURES),
        "lora_a": torch.zeros(NUM_SLOTS, WIDTH, IN_FEATURES),
        "lora_b": torch.zeros(NUM_SLOTS, WIDTH, OUT_FEATURES),
        "token_slots": torch.zeros(3, dtype=torch.int64),
        "y": torch.zeros(3, OUT_FEATURES),
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"x": torch.zeros(3, IN_FEATURES, dtype=torch.int32)}, "x must be float16, bfloat16"),
        ({"x": torch.zeros(IN_FEATURES)}, r"x must be 2-D \[T, features\]"),
        ({"lora_a": torch.zeros(WIDTH, IN_FEATURES)}, r"lora_a must be 3-D \[L, W, features\]"),
        ({"lora_a": torch.zeros(3, WIDTH, 64)}, "lora_a is .* in = 64, x has 80 features"),
        ({"lora_a": torch.zeros(3, WIDTH, 80).half()}, "lora_a is torch.float16, the activ"),
        ({"lora_a": torch.zeros(3, 16, 80)}, r"lora_b has \(L, W\) = \(3, 24\), lora_a has"),
        ({"lora_b": torch.zeros(2, WIDTH, 72)}, r"lora_b has \(L, W\) = \(2, 24\)"),
        ({"lora_b": torch.zeros(3, WIDTH, 64)}, "lora_b is .* out = 64, y has 72 features"),
        ({"lora_b": torch.zeros(3, WIDTH, 72).half()}, "lora_b is torch.float16, the activ"),
        ({"y": torch.zeros(4, OUT_FEATURES)}, "s has 3 rows, y has 4"),
        ({"y": torch.zeros(3, OUT_FEATURES).half()}, "lora_b is torch.float32, the activ"),
        ({"token_slots": torch.zeros(3, dtype=torch.int32)}, "token_slots must be a 1-D int64"),
        ({"token_slots": torch.zeros(4, dtype=torch.int64)}, "token_slots has 4 entries for 3"),
        ({"token_slots": torch.zeros(1, 3, dtype=torch.int64)}, "token_slots must be a 1-D"),
        ({"lora_a": torch.zeros(3, WIDTH, 80, device="meta")}, "lora_a is on meta, the activ"),
        ({"token_slots": torch.zeros(3, dtype=int, device="meta")}, "token_slots is on meta"),
    ],
)
def test_apply_rejects_mismatched_inputs_naming_them(interpreted, change, message):
    args = _apply_args() | change
    with pytest.raises(ValueError, match=message):
        interpreted.lora_apply(**args)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"s": torch.zeros(3, WIDTH, dtype=torch.float16)}, r"s must be a float32 \[T, W\]"),
        ({"s": torch.zeros(3, 16)}, "lora_b is .* W = 24, s has W = 16"),
        ({"s": torch.zeros(3, WIDTH, device="meta")}, "s is on meta, the activations on cpu"),
    ],
)
def test_expand_rejects_a_mismatched_s_naming_it(interpreted, change, message):
    args = {
        "s": torch.zeros(3, WIDTH),
        "lora_b": torch.zeros(NUM_SLOTS, WIDTH, OUT_FEATURES),
        "token_slots": torch.zeros(3, dtype=torch.int64),
        "y": torch.zeros(3, OUT_FEATURES),
    } | change
    with pytest.raises(ValueError, match=message):
        interpreted.lora_expand(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 5, 17, 300])
def test_compiled_kernels_match_reference_on_cuda(num_tokens, dtype):
    from core_lora.triton_lora import lora_expand, lora_shrink

    x = _randn(num_tokens, 1024, dtype=dtype, device="cuda", seed=1)
    lora_a = _randn(NUM_SLOTS, 48, 1024, dtype=dtype, device="cuda", seed=2)
    lora_b = _randn(NUM_SLOTS, 48, 1032, dtype=dtype, device="cuda", seed=3)
    y = _randn(num_tokens, 1032, dtype=dtype, device="cuda", seed=4)
    y_before = y.clone()
    token_slots = _mixed_slots(num_tokens, device="cuda")
    s = lora_shrink(x, lora_a, token_slots)
    _assert_shrink_matches_reference(s, x, lora_a, token_slots)
    lora_expand(s, lora_b, token_slots, y)
    half_ulp = torch.finfo(dtype).eps / 2
    _assert_expand_matches_reference(y, y_before, s, lora_b, token_slots, rounding=half_ulp)
