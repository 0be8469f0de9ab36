"""core-moe-triton's fused MoE kernel against core's reference, in Triton's interpreter.

Each test runs `fused_moe_triton` with its kernels module swapped for a private copy
interpreted on the CPU (see tests/triton_interpreted.py) and checks the output against
`fused_moe_reference` with the op's tolerances. On a CUDA machine the kernels also run
compiled, and everywhere they compile for GPU targets without a GPU (the interpreter
forgives what the compiler does not: a tile under tl.dot's 16, shared memory over the
device's).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
import torch
from triton_interpreted import (
    GPU_TARGETS,
    assert_matches,
    compiles_within_shared_memory,
    load_interpreted,
)

pytest.importorskip("core_moe_triton", reason="core-moe-triton is not installed (optional plugin)")
# Imported here, before any TRITON_INTERPRET is set: triton decorates its own @jit helpers at
# import, and interpreted ones would break every compiled kernel later in this process.
triton = pytest.importorskip("triton", reason="triton is not installed (the MoE kernels need it)")

from core_moe_triton.ops import (  # noqa: E402
    KERNELS_MODULE,
    PROVIDER,
    expert_blocks,
    fused_moe_triton,
    register,
)

from core.ops import CORE_OPS, fused_moe_reference, provider  # noqa: E402
from core.ops.fused_moe import TOLERANCES, _fused_moe_samples  # noqa: E402

Args = tuple[torch.Tensor, ...]  # hidden, w13, w2, topk_weights, topk_ids

# Pointer types beyond the activation dtype's; the launchers pass these tensors.
POINTERS = {
    "sorted_slot_ids_ptr": "*i32",
    "block_expert_ids_ptr": "*i32",
    "topk_weights_ptr": "*fp32",
}
# The kernel, its output pointer's type given the activation dtype (None: that dtype).
KERNELS = {"gate_up": ("_gate_up_kernel", None), "down": ("_down_kernel", "*fp32")}


@pytest.fixture(scope="module")
def kernels() -> ModuleType:
    """A private copy of `core_moe_triton.kernels` whose kernels run in the interpreter."""
    return load_interpreted(KERNELS_MODULE)


def make_args(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    size: int = 40,
    inter: int = 24,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Args:
    """Random inputs of the op; ids drawn with replacement (a token may pick an expert twice)."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=generator) * scale).to(dtype)

    hidden = randn(num_tokens, size)
    w13 = randn(num_experts, 2 * inter, size, scale=size**-0.5)
    w2 = randn(num_experts, size, inter, scale=inter**-0.5)
    topk_weights = torch.rand(num_tokens, top_k, generator=generator).softmax(dim=1)
    topk_ids = torch.randint(0, num_experts, (num_tokens, top_k), generator=generator)
    return hidden, w13, w2, topk_weights, topk_ids


def assert_matches_reference(kernels: ModuleType, args: Args) -> torch.Tensor:
    out = fused_moe_triton(*args, kernels=kernels)
    assert_matches(out, fused_moe_reference(*args), TOLERANCES)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interpreted_kernel_matches_reference_on_every_conformance_sample(kernels, dtype):
    for sample in _fused_moe_samples(dtype, torch.device("cpu")):
        out = fused_moe_triton(*sample.args, kernels=kernels)
        assert_matches(out, fused_moe_reference(*sample.args), TOLERANCES, sample.name)


@pytest.mark.parametrize("top_k", [1, 2, 8])
@pytest.mark.parametrize("num_experts", [4, 8, 16])
def test_expert_counts_and_top_k_match_reference(kernels, num_experts, top_k):
    assert_matches_reference(kernels, make_args(7, num_experts, top_k, seed=num_experts + top_k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slots_routed_to_no_expert_add_nothing(kernels, dtype):
    hidden, w13, w2, topk_weights, topk_ids = make_args(6, 4, 2, dtype=dtype)
    topk_ids[0] = -1  # a token no expert serves
    topk_ids[1, 0] = -1
    topk_ids[2, 1] = 4  # past the last expert, as another rank's experts are
    out = assert_matches_reference(kernels, (hidden, w13, w2, topk_weights, topk_ids))
    assert out[0].count_nonzero() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_expert_taking_every_token_matches_reference(kernels, dtype):
    hidden, w13, w2, topk_weights, topk_ids = make_args(33, 6, 2, dtype=dtype)
    assert_matches_reference(kernels, (hidden, w13, w2, topk_weights, torch.full_like(topk_ids, 3)))


@pytest.mark.parametrize("num_tokens", [1, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_counts_match_reference(kernels, num_tokens, dtype):
    assert_matches_reference(kernels, make_args(num_tokens, 8, 2, dtype=dtype, seed=num_tokens))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sizes_past_one_tile_match_reference(kernels, dtype):
    # H=136 and I=80: several column tiles and reduction steps, the last ones masked.
    assert_matches_reference(kernels, make_args(5, 4, 2, size=136, inter=80, dtype=dtype))


def test_strided_inputs_match_reference(kernels):
    hidden, w13, w2, topk_weights, topk_ids = make_args(9, 4, 2)
    wide = torch.cat([hidden, hidden], dim=1)[:, ::2]  # rows of stride 2H, columns of 2
    weights_t = topk_weights.t().contiguous().t()  # column-major [T, K]
    assert_matches_reference(kernels, (wide, w13, w2, weights_t, topk_ids.int()))


def test_expert_blocks_group_slots_by_expert_in_padded_tiles():
    # Slots 0..5 route to experts 1, -, 0, 1, 1, - (5 is past the 4 experts).
    blocks = expert_blocks(torch.tensor([[1, -1], [0, 1], [1, 5]]), num_experts=4, block_m=2)
    # Expert 0: slot 2 and padding (6); expert 1: slots 0, 3, 4 and padding; then spare
    # tiles (the worst case, 6 slots + 4 experts x 1 padding, is 5 tiles) of expert id 4.
    assert blocks.sorted_slot_ids.tolist() == [2, 6, 0, 3, 4, 6, 6, 6, 6, 6]
    assert blocks.block_expert_ids.tolist() == [0, 1, 1, 4, 4]
    assert (blocks.block_m, blocks.top_k, blocks.num_slots) == (2, 2, 6)


def test_inputs_the_kernels_do_not_take_go_to_the_reference():
    args = tuple(t.double() if t.is_floating_point() else t for t in make_args(3, 4, 2))
    # No kernels module: touching one would raise AttributeError.
    out = fused_moe_triton(*args, kernels=object())
    assert torch.equal(out, fused_moe_reference(*args))


def test_register_serves_fused_moe_on_cuda():
    # Registration is re-entrant, so this holds after any earlier test registered it too.
    served = CORE_OPS.registrations_of(register)
    assert [(op.name, device_type) for op, device_type in served] == [("fused_moe", "cuda")]
    register()
    assert provider("fused_moe", "cuda") == PROVIDER


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_kernel_matches_reference_on_cuda(dtype):
    cases = [sample.args for sample in _fused_moe_samples(dtype, torch.device("cpu"))]
    cases.append(make_args(300, 16, 2, size=256, inter=192, dtype=dtype))
    cases.append(make_args(33, 8, 8, size=40, inter=24, dtype=dtype))
    for args in cases:
        out = fused_moe_triton(*(t.cuda() for t in args))
        assert_matches(out, fused_moe_reference(*args), TOLERANCES)


@pytest.mark.skipif(
    triton.knobs.runtime.interpret, reason="TRITON_INTERPRET is set: the kernels are not compiled"
)
@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("name", KERNELS)
def test_kernel_compiles_for_gpu_target_within_shared_memory(name, dtype, target):
    kernel_name, out_type = KERNELS[name]
    kernel = getattr(importlib.import_module(KERNELS_MODULE), kernel_name)
    constexprs = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, UPCAST=False)  # a prefill's tiles

    def pointer_type(name: str) -> str:
        if name == "out_ptr":
            return out_type or f"*{dtype}"
        return POINTERS.get(name, f"*{dtype}")

    assert compiles_within_shared_memory(kernel, constexprs, pointer_type, target)
