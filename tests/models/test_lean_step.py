"""The lean step (core.models.lean_step): each decoder layer's lean callable computes its
forward to the bit, skips the module tree where the layer is plain, falls back to the
modules where an option is set, and sees a linear method wrapped after it was made."""

from __future__ import annotations

import pytest
import torch
from model_harness import DenseAttentionBackend, our_model, run_logits, tiny_hf_model
from test_gemma import GEMMA, random_gemma

from core.forward_context import ForwardContext, set_forward_context
from core.models import ArchConfig, iter_attention_layers
from core.models.lean_step import lean
from core.quantization.interface import WrappedLinearMethod

NUM_TOKENS = 7

CASES = {
    "llama": lambda: tiny_hf_model("LlamaForCausalLM"),
    "qwen2-qkv-bias": lambda: tiny_hf_model("Qwen2ForCausalLM"),
    "qwen3-qk-norm": lambda: tiny_hf_model("Qwen3ForCausalLM"),
    "mistral-window": lambda: tiny_hf_model("MistralForCausalLM", sliding_window=3),
    "mixtral-experts": lambda: tiny_hf_model("MixtralForCausalLM", num_local_experts=4),
    "gemma3-sandwich-norms": lambda: random_gemma("Gemma3ForCausalLM"),
}


def _ours(hf_model):
    architecture = hf_model.config.architectures[0]
    if architecture not in GEMMA:
        return our_model(hf_model)
    model = GEMMA[architecture][2](ArchConfig.from_hf(hf_model.config.to_dict()))
    model.load_weights(hf_model.state_dict().items())
    return model


def _bound(model):
    layers = list(iter_attention_layers(model))
    for layer in layers:
        layer.bind_backend(DenseAttentionBackend)
        layer.kv_cache = torch.empty(0)
    return ForwardContext({layer.layer_name: None for layer in layers}, NUM_TOKENS)


@pytest.mark.parametrize("case", CASES)
def test_each_layers_lean_callable_equals_its_forward_to_the_bit(case):
    model = _ours(CASES[case]())
    context = _bound(model)
    hidden_size = model.config.hidden_size
    generator = torch.Generator().manual_seed(0)
    positions = torch.arange(NUM_TOKENS)
    with torch.inference_mode(), set_forward_context(context):
        for layer in model.model.layers:
            hidden = torch.randn(NUM_TOKENS, hidden_size, generator=generator)
            residual = torch.randn(NUM_TOKENS, hidden_size, generator=generator)
            for stream in (None, residual):
                # Norms with a residual write in place: each path gets its own copies.
                want = layer(positions, hidden.clone(), _clone(stream))
                got = lean(layer)(positions, hidden.clone(), _clone(stream))
                assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def _clone(tensor):
    return None if tensor is None else tensor.clone()


def _count_calls(monkeypatch, module) -> list[int]:
    """Counts the module's forward calls (a hook would make the lean step call it)."""
    calls: list[int] = []
    forward = module.forward

    def counted(*args):
        calls.append(1)
        return forward(*args)

    monkeypatch.setattr(module, "forward", counted)
    return calls


def test_a_plain_layer_runs_without_calling_its_modules(monkeypatch):
    model = our_model(tiny_hf_model("LlamaForCausalLM"))
    layer = model.model.layers[0]
    parts = (layer, layer.self_attn, layer.self_attn.qkv_proj, layer.mlp)
    calls = [_count_calls(monkeypatch, m) for m in parts]
    run_logits(model, torch.arange(NUM_TOKENS))
    assert [len(c) for c in calls] == [0, 0, 0, 0]


def test_attention_with_head_norms_falls_back_to_its_module_and_the_mlp_stays_lean(monkeypatch):
    model = our_model(tiny_hf_model("Qwen3ForCausalLM"))
    layer = model.model.layers[0]
    parts = (layer.self_attn, layer.self_attn.qkv_proj, layer.mlp)
    attention, qkv, mlp = (_count_calls(monkeypatch, m) for m in parts)
    run_logits(model, torch.arange(NUM_TOKENS))
    assert (len(attention), len(qkv), len(mlp)) == (1, 1, 0)


def test_hooks_registered_after_the_first_forward_run():
    model = our_model(tiny_hf_model("LlamaForCausalLM"))
    input_ids = torch.arange(NUM_TOKENS)
    run_logits(model, input_ids)  # the lean callables are made here
    seen = []
    down = model.model.layers[1].mlp.down_proj
    handle = down.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    run_logits(model, input_ids)
    handle.remove()
    run_logits(model, input_ids)
    assert seen == [torch.Size([NUM_TOKENS, model.config.intermediate_size])]


class _Doubled(WrappedLinearMethod):
    def apply(self, layer, x, bias):
        return 2 * self.base.apply(layer, x, bias)


def test_a_linear_method_wrapped_after_the_first_forward_applies():
    hf_model = tiny_hf_model("LlamaForCausalLM")
    model, reference = our_model(hf_model), our_model(hf_model)
    input_ids = torch.randint(0, hf_model.config.vocab_size, (NUM_TOKENS,))
    before = run_logits(model, input_ids)  # the lean callables are made here
    for m in (model, reference):
        m.model.layers[1].mlp.down_proj.wrap_linear_method(_Doubled)
    after = run_logits(model, input_ids)
    assert not torch.equal(after, before)
    # The reference runs its first forward with the wrapper already in place.
    assert torch.equal(after, run_logits(reference, input_ids))
