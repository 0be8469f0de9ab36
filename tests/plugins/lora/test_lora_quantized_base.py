"""LoRA over 4-bit weights: the wrapper keeps the base's packed method and adds the deltas.

The default model's GGUF served two ways with the same rank-16 adapters: blocks kept packed
(`quantization="gguf"`, core::quant_linear under every projection) and dequantized to float
(`quantization="none"`). The adapters act the same on both: equal greedy tokens, close
logprobs (the two bases differ only by the packed kernel's summation order).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from core import LLM, LoRARequest, SamplingParams
from core.model_loader import resolve_model
from core.models.layers.linear import LinearBase
from core.testing.lora_adapters import AdapterSpec, write_adapter

pytestmark = pytest.mark.slow  # two engines of the default model, about 20 s

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> list[LoRARequest]:
    config = transformers.AutoConfig.for_model(**resolve_model(None).hf_config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    root = tmp_path_factory.mktemp("adapters")
    for i in range(2):
        spec = AdapterSpec(rank=16, alpha=32, targets=TARGETS, seed=i, magnitude=0.05)
        write_adapter(root / f"a{i}", model, spec)
    return [LoRARequest(f"a{i}", i + 1, str(root / f"a{i}")) for i in range(2)]


def run(quantization: str, adapters: list[LoRARequest]):
    llm = LLM(
        None,
        quantization=quantization,
        dtype="float32",
        max_model_len=256,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=16,
    )
    # The first prompt again on the base model: shows that the adapter changes it.
    loras = [adapters[0], adapters[1], None, None]
    outputs = llm.generate(PROMPTS + PROMPTS[:1], GREEDY, use_tqdm=False, lora_request=loras)
    methods = {
        type(m.linear_method.base).__name__
        for m in llm.engine.core.executor.worker.model.modules()
        if isinstance(m, LinearBase)
    }
    llm.engine.shutdown()
    return outputs, methods


def test_adapters_act_the_same_on_packed_and_dequantized_weights(adapters) -> None:
    packed, packed_methods = run("gguf", adapters)
    dense, dense_methods = run("none", adapters)
    assert packed_methods == {"GGUFLinearMethod"} and dense_methods == {"UnquantizedLinearMethod"}
    for got, want in zip(packed, dense, strict=True):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        for a, b in zip(got.outputs[0].logprobs, want.outputs[0].logprobs, strict=True):
            token = next(iter(b))
            assert abs(a[token].logprob - b[token].logprob) < 2e-3
    assert packed[0].outputs[0].token_ids != packed[3].outputs[0].token_ids
