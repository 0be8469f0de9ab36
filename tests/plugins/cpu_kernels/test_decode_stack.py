"""core-cpu-kernels' layer stack (core_cpu_kernels.layer_stack): the default model's decode
steps run its 30 layers in one C++ call, and every token and logprob equals, to the bit,
what the layers run one by one give; the steps it cannot serve run the layers."""

from __future__ import annotations

import pytest
import torch

from core import SamplingParams
from core.entrypoints.llm import LLM
from core.kernel_choice import KERNEL_CHOICES, ROW_BUCKETS
from core.models.llama import LlamaModel
from core.quantization.interface import WrappedLinearMethod

layer_stack = pytest.importorskip("core_cpu_kernels.layer_stack")
_C = pytest.importorskip("core_cpu_kernels._C")
candidates = pytest.importorskip("core_cpu_kernels.candidates")

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "List three prime numbers and explain why each is prime:",
]


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", max_model_len=512, kv_cache_memory="64MiB")


@pytest.fixture
def served(monkeypatch):
    """What the stack did each time it was offered a step: True (served) or False."""
    seen: list[bool] = []
    call = layer_stack.DecodeStack.__call__

    def counted(self, *args):
        out = call(self, *args)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(layer_stack.DecodeStack, "__call__", counted)
    return seen


def _generate(llm, params):
    return [
        (o.outputs[0].token_ids, [sorted(d.items()) for d in o.outputs[0].logprobs or []])
        for o in llm.generate(PROMPTS, params, use_tqdm=False)
    ]


def _without_stack(monkeypatch):
    monkeypatch.setattr(LlamaModel, "_run_stack", lambda self, positions, hidden: None)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=20, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=20, logprobs=2),
    ],
    ids=["greedy", "seeded"],
)
def test_decode_steps_in_one_call_equal_the_layers_to_the_bit(llm, served, monkeypatch, params):
    stacked = _generate(llm, params)
    assert served.count(True) >= params.max_tokens - 1  # every batch of decode rows
    assert served.count(False) >= 1  # the prompts' prefill
    offered = len(served)
    _without_stack(monkeypatch)
    assert _generate(llm, params) == stacked
    assert len(served) == offered  # the stack was not offered a step


def test_int8_activations_run_in_the_stack_as_in_the_layers(llm, served, monkeypatch):
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, ignore_eos=True)
    float32 = _generate(llm, params)
    monkeypatch.setenv("CORE_CPU_INT8_ACTIVATIONS", "1")
    stacked = _generate(llm, params)
    assert served.count(True) >= 2 * (params.max_tokens - 1)
    assert stacked != float32  # the GEMVs quantized x: the logprobs moved
    _without_stack(monkeypatch)
    assert _generate(llm, params) == stacked


def _assert_stacked_as_layers(llm, params, served, monkeypatch, unlike) -> None:
    """With the stack serving every decode step, the outputs differ from `unlike` and equal
    the layers' run one by one, to the bit."""
    served.clear()
    stacked = _generate(llm, params)
    assert served.count(True) >= params.max_tokens - 1
    assert stacked != unlike
    _without_stack(monkeypatch)
    assert _generate(llm, params) == stacked


def _choose(monkeypatch, kernels: dict[tuple[int, int], str]) -> None:
    """Every quant_linear problem served by the candidate named for its weight's shape in
    `kernels` (default "packed") at every row count, as a measured choice would."""
    by_name = {c.name: c for c in KERNEL_CHOICES.candidates["quant_linear"]}
    for problem in [p for p in KERNEL_CHOICES.chosen if p.op == "quant_linear"]:
        kernel = by_name[kernels.get(problem.shape, "packed")]
        monkeypatch.setitem(KERNEL_CHOICES.chosen, problem, [kernel] * len(ROW_BUCKETS))


@pytest.mark.skipif(
    not candidates.strips_available(), reason="this CPU has no bf16 dot products for the copies"
)
@pytest.mark.parametrize("kernel", ["strips", "interleaved"])
def test_layers_whose_kernel_choice_keeps_a_copy_run_in_the_stack_on_it(
    kernel, served, monkeypatch
):
    llm = LLM(dtype="bfloat16", max_model_len=512, kv_cache_memory="64MiB")
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=3, ignore_eos=True)
    _choose(monkeypatch, {})
    packed = _generate(llm, params)
    # SmolLM2's gate_up_proj: [3072, 576]; the other shapes stay on the packed GEMV.
    _choose(monkeypatch, {(3072, 576): kernel})
    # gate_up multiplied W rounded to bf16 (strips) or summed in another order
    # (interleaved): the logprobs moved.
    _assert_stacked_as_layers(llm, params, served, monkeypatch, unlike=packed)


def test_a_linear_method_wrapped_after_the_first_step_is_run_by_the_layers(
    llm, served, monkeypatch
):
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, ignore_eos=True)
    want = _generate(llm, params)
    assert served.count(True) >= params.max_tokens - 1
    served.clear()
    down = llm.engine.core.executor.worker.runner.model.model.layers[5].mlp.down_proj
    # What LoRA does after loading: a wrapper around the layer's method (here adding
    # nothing), whose apply the stack cannot run in C++.
    monkeypatch.setattr(down, "linear_method", WrappedLinearMethod(down.linear_method))
    assert _generate(llm, params) == want
    assert served and not any(served)


def test_the_kernel_refuses_lists_that_are_not_whole_layers():
    hidden = torch.zeros(1, 8)
    with pytest.raises(RuntimeError, match="tensors, 4 bits, 2 eps"):
        _C.DecodeLayers(
            tensors=[hidden], bits=[4], eps=[1e-5], scales=[1.0], windows=[0], heads=[1, 1, 8],
            block_size=16, watched=[],
        )  # fmt: skip


def test_gathered_layers_go_stale_when_a_watched_tensor_is_written_in_place():
    weight, other = torch.zeros(4), torch.zeros(4)
    layers = _C.DecodeLayers(
        tensors=[other] * 21, bits=[4] * 4, eps=[1e-5] * 2, scales=[1.0], windows=[0],
        heads=[1, 1, 8], block_size=16, watched=[weight],
    )  # fmt: skip
    other.add_(1)  # not watched
    assert not layers.stale()
    weight.add_(1)
    assert layers.stale()


@pytest.mark.skipif(
    not candidates.strips_available(), reason="this CPU has no bf16 dot products for the copies"
)
def test_a_weight_written_in_place_reaches_the_stack_through_a_fresh_copy(served, monkeypatch):
    llm = LLM(dtype="bfloat16", max_model_len=512, kv_cache_memory="64MiB")
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=3, ignore_eos=True)
    _choose(monkeypatch, {(3072, 576): "interleaved"})
    before = _generate(llm, params)
    gate_up = llm.engine.core.executor.worker.runner.model.model.layers[3].mlp.gate_up_proj
    weight = gate_up.linear_method.packed_weight(gate_up)
    with torch.no_grad():
        weight.scales.mul_(1.5)  # what a weight update does: the same tensor, new values
    _assert_stacked_as_layers(llm, params, served, monkeypatch, unlike=before)


class _Plain:
    """What `build` reads of a PlainLayer."""

    def __init__(self, heads, device="cpu"):
        self.num_heads, self.num_kv_heads, self.head_dim = heads
        self.input_norm = torch.nn.Module()
        self.input_norm.weight = torch.empty(8, device=device)


def test_layers_with_different_heads_get_no_stack():
    assert layer_stack.build([_Plain((4, 2, 8)), _Plain((4, 2, 8))]) is not None
    assert layer_stack.build([_Plain((4, 2, 8)), _Plain((4, 4, 8))]) is None


def test_layers_off_the_cpu_get_no_stack():
    assert layer_stack.build([_Plain((4, 2, 8), device="meta")]) is None


def test_core_info_names_the_plugin_as_a_layer_stack_provider(core_info):
    assert "layer stacks (plain decoder layers in one call" in core_info
    assert "step): core-cpu-kernels" in core_info
