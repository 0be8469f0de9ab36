"""The C++ core::fp8_linear kernels against a float64 product, per vector ISA; the
candidates the op is chosen among; and FP8 layers keeping their weights at one byte.

Expected values come from the weight's e4m3 values times their scales, each W the layout's
one float32 product (core/ops/fp8_linear.py), then a float64 matmul, never from the
kernels. A float32 output may differ from them by float32 summation order alone: at most
1e-5 of |x| @ |W|^T. A bfloat16 / float16 one is also rounded once, so it lies within half
an ulp of the exact value more. Row counts 1 and 3 take the GEMV (up to 4: one pass of its
tokens), 17 and 64 the blocked GEMM (full, partial and one-vector token blocks).
"""

from __future__ import annotations

import pytest
import torch

import core.ops
from core import LLM, SamplingParams
from core.ops.fp8_linear import TOLERANCES, dequantize, fp8_linear_reference, quantize
from core.quantization.fp8 import Fp8LinearMethod
from core.testing.tiny_checkpoint import write_tiny_checkpoint

ops = pytest.importorskip(
    "core_cpu_kernels.ops", reason="core-cpu-kernels is not installed (optional plugin)"
)
from core_cpu_kernels import _C, candidates, weight_copies  # noqa: E402

FP8 = torch.float8_e4m3fn
ISAS = _C.fp8_linear_isas()
ROWS = [1, 3, 17, 64]
ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
# (N, K, block_n, block_k): one scale per tensor, per output row (K = 96 whole vectors of
# every ISA, K = 40 a tail past them), DeepSeek's 128 x 128 blocks cut short at both edges
# (K = 200: a partial last block, itself past whole vectors), and 16-input blocks.
LAYOUTS = {
    "per-tensor": (70, 96, 70, 96),
    "per-channel": (70, 96, 1, 96),
    "per-channel, K past whole vectors": (9, 40, 1, 40),
    "128x128 blocks, K not a multiple": (300, 200, 128, 128),
    "16-input blocks": (48, 96, 16, 16),
}


def _weight(n: int, k: int, block_n: int, block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random W quantized by core's `quantize` (each block's largest |W| at 448), its
    scales repeated per row as the layout holds them."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(1))
    weight, scales = quantize(w, block_n, block_k)
    return weight, scales.repeat_interleave(block_n, dim=0)[:n].contiguous()


def _every_value_weight(n: int, k: int, block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random e4m3 bytes, every one but the NaNs (0x7F, 0xFF) equally likely: subnormals,
    zeros of both signs and +-448 included; scales spread over two decades."""
    gen = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 254, (n, k), generator=gen)
    codes += (codes >= 0x7F).long()  # skip 0x7F; 0xFF is past 253 + 1
    weight = codes.to(torch.uint8).view(FP8)
    blocks = -(-k // block_k)
    scales = 10 ** torch.empty(n, blocks).uniform_(-3, -1, generator=gen)
    return weight, scales


def _assert_exact_up_to_sum_order(got, x, weight, scales, block_k) -> None:
    exact_w = dequantize(weight, scales, block_k).double()  # each W one float32 product
    want = x.double() @ exact_w.T
    scale = x.double().abs() @ exact_w.abs().T
    tolerance = 1e-5 * scale + ULP.get(x.dtype, 0.0) * want.abs() + 1e-30
    assert got.dtype == x.dtype and got.shape == want.shape
    assert ((got.double() - want).abs() <= tolerance).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_kernel_equals_the_product_of_the_dequantized_weight(isa, layout, rows, dtype):
    n, k, block_n, block_k = LAYOUTS[layout]
    weight, scales = _weight(n, k, block_n, block_k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(0)).to(dtype)
    got = _C.fp8_linear(x, weight, scales, block_k, isa)
    _assert_exact_up_to_sum_order(got, x, weight, scales, block_k)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_every_e4m3_value_subnormals_and_the_largest_included(isa, rows, dtype):
    weight, scales = _every_value_weight(37, 200, 48)  # blocks of 48: none a whole vector
    x = torch.randn(rows, 200, generator=torch.Generator().manual_seed(0)).to(dtype)
    got = _C.fp8_linear(x, weight, scales, 48, isa)
    _assert_exact_up_to_sum_order(got, x, weight, scales, 48)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 17])
def test_each_weight_reads_as_torchs_value_times_its_scale_exactly(isa, rows):
    # Row n holds byte n in every column; each token's x is one-hot, so every output is one
    # weight times 1 (plus zeros): the GEMV's and the GEMM's conversion, compared bitwise.
    codes = torch.arange(256, dtype=torch.uint8)
    codes[[0x7F, 0xFF]] = 0  # the NaNs
    weight = codes[:, None].expand(256, 24).contiguous().view(FP8)
    scales = torch.full((256, 2), 0.37)
    x = torch.eye(24)[torch.arange(rows) % 24]
    got = _C.fp8_linear(x, weight, scales, 12, isa)
    want = (weight[:, 0].float() * 0.37).expand(rows, -1)
    assert torch.equal(got, want)


def test_bad_layouts_are_refused_naming_the_argument():
    weight, scales = _weight(8, 32, 1, 32)
    x = torch.randn(2, 32)
    with pytest.raises(
        RuntimeError, match=r"scales must be a contiguous float32 CPU tensor \[8, 2\]"
    ):
        _C.fp8_linear(x, weight, scales, 16)
    with pytest.raises(RuntimeError, match="weight must be a contiguous 2-D float8_e4m3fn"):
        _C.fp8_linear(x, weight.float(), scales, 32)
    with pytest.raises(RuntimeError, match=r"x must be a contiguous CPU tensor \[T, 32\]"):
        _C.fp8_linear(torch.randn(2, 31), weight, scales, 32)
    with pytest.raises(RuntimeError, match="block_k must be positive"):
        _C.fp8_linear(x, weight, scales, 0)
    with pytest.raises(RuntimeError, match="isa 'sse9'"):
        _C.fp8_linear(x, weight, scales, 32, "sse9")


# ---- the op's candidates -------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _own_choices(choices):
    """Every test here gets its own kernel choices (conftest.py)."""


def _registered(choices) -> dict[str, object]:
    return {c.name: c for c in choices.candidates["fp8_linear"]}


def test_register_serves_fp8_linear_on_the_cpu_with_the_fp8_kernel_first(choices):
    ops.register()
    assert core.ops.provider("fp8_linear", "cpu") == "core-cpu-kernels"
    assert list(_registered(choices)) == ["fp8", "dequantized", "dequantized-onednn"]


@pytest.mark.parametrize("name", ["fp8", "dequantized", "dequantized-onednn"])
@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_every_candidate_equals_the_reference_through_its_copy(choices, name, rows, dtype):
    candidate = _registered(choices)[name]
    weight, scales = _weight(*LAYOUTS["128x128 blocks, K not a multiple"])
    x = torch.randn(rows, 200, generator=torch.Generator().manual_seed(0)).to(dtype)
    problem = candidates.fp8_linear_problem(x, weight)
    if not (candidate.available() and candidate.takes(problem)):
        pytest.skip(f"{name} does not take {problem.label()} here")
    before = weight_copies.copied_bytes()
    got = candidate(x, weight, scales, 128)
    tolerance = TOLERANCES[dtype]
    want = fp8_linear_reference(x, weight, scales, 128)
    torch.testing.assert_close(got, want, rtol=tolerance.rtol, atol=tolerance.atol)
    # The fp8 kernel keeps nothing beside the weight; the others their dequantized copy.
    assert (weight_copies.copied_bytes() > before) == (name != "fp8")
    assert (candidate.copy_bytes(problem) > 0) == (name != "fp8")


def test_float16_x_is_served_by_the_fp8_kernel_alone(choices):
    # A copy rounded to float16 would break the op's contract (only bf16 x may multiply a
    # rounded W), so the dequantized candidates refuse it.
    problem = candidates.fp8_linear_problem(
        torch.zeros(1, 8, dtype=torch.float16), torch.zeros(4, 8)
    )
    live = [c.name for c in _registered(choices).values() if c.available() and c.takes(problem)]
    assert live == ["fp8"]


@pytest.mark.parametrize("name", ["fp8", "dequantized"])
@pytest.mark.parametrize("rows", [1, 129])
def test_the_op_runs_the_forced_candidate(choices, name, rows, monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", f"fp8_linear={name}")
    ran = []
    candidate = _registered(choices)[name]
    real = type(candidate).__call__
    monkeypatch.setattr(
        type(candidate), "__call__", lambda self, *a: ran.append(self.name) or real(self, *a)
    )
    weight, scales = _weight(*LAYOUTS["per-channel"])
    x = torch.randn(rows, 100)[:, :96]  # strided rows: copied once for the kernels
    got = ops.fp8_linear(x, weight, scales, 96)
    assert ran == [name]
    tolerance = TOLERANCES[torch.float32]
    want = fp8_linear_reference(x, weight, scales, 96)
    torch.testing.assert_close(got, want, rtol=tolerance.rtol, atol=tolerance.atol)


def test_inputs_the_kernels_do_not_take_go_to_the_reference(choices, monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "fp8_linear=fp8")
    weight, scales = _weight(*LAYOUTS["per-channel"])
    x = torch.randn(3, 96, dtype=torch.float64)  # a dtype no kernel takes
    assert torch.equal(
        ops.fp8_linear(x, weight, scales, 96), fp8_linear_reference(x, weight, scales, 96)
    )


# ---- FP8 layers keep their weights at one byte ----------------------------------------------


def _greedy(model_dir, prompts) -> tuple[list[list[int]], list[torch.nn.Module]]:
    """The engine's greedy tokens for `prompts` with `--quantization fp8`, and its FP8
    layers."""
    llm = LLM(str(model_dir), quantization="fp8", dtype="float32", max_model_len=32,
              kv_cache_memory="1MiB")  # fmt: skip
    try:
        model = llm.engine.core.executor.worker.loaded.model
        layers = [
            m
            for m in model.modules()
            if isinstance(getattr(m, "linear_method", None), Fp8LinearMethod)
        ]
        greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        outputs = llm.generate(prompts, greedy, use_tqdm=False)
    finally:
        llm.engine.shutdown()
    return [list(o.outputs[0].token_ids) for o in outputs], layers


def test_an_fp8_models_layers_keep_their_weights_at_one_byte(tmp_path, monkeypatch):
    """With core-cpu-kernels serving core::fp8_linear, `--quantization fp8` keeps each linear
    weight in e4m3 beside its scales, no dense copy, and the engine's greedy tokens are
    those of the dense copies core makes where no kernel serves the op."""
    write_tiny_checkpoint(tmp_path)
    prompts = [[5, 9, 13, 2], [7, 7, 3, 11, 4]]
    tokens, layers = _greedy(tmp_path, prompts)
    assert len(layers) == 8  # 2 decoder layers: qkv, o, gate_up and down projections
    for layer in layers:
        assert layer.fp8_weight.dtype == FP8 and layer.fp8_weight.element_size() == 1
        assert not hasattr(layer, "dense_weight")
    real = core.ops.provider
    monkeypatch.setattr(
        core.ops, "provider", lambda op, device: None if op == "fp8_linear" else real(op, device)
    )
    dense_tokens, dense_layers = _greedy(tmp_path, prompts)
    assert all(hasattr(layer, "dense_weight") for layer in dense_layers)
    assert tokens == dense_tokens
