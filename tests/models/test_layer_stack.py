"""Layer stacks (core.models.layer_stack): which decoder layers are plain, and how a model
offers its stage to a registered stack, runs its layers where the stack declines, and
never hands a stack a step while hooks are registered."""

from __future__ import annotations

import pytest
import torch
from model_harness import our_model, run_logits, tiny_hf_model
from test_gemma import random_gemma
from test_lean_step import _bound, _ours

from core.forward_context import set_forward_context
from core.models import layer_stack
from core.models.lean_step import lean

NUM_TOKENS = 7

NOT_PLAIN = {
    "qwen2-qkv-bias": lambda: tiny_hf_model("Qwen2ForCausalLM"),
    "qwen3-qk-norm": lambda: tiny_hf_model("Qwen3ForCausalLM"),
    "mixtral-experts": lambda: tiny_hf_model("MixtralForCausalLM", num_local_experts=4),
    "gemma3-sandwich-norms": lambda: random_gemma("Gemma3ForCausalLM"),
}


class _LayersInTurn:
    """A builder whose stack runs each layer's lean callable in turn (what a stack must
    equal), recording what it was given; `serve` False makes it decline every step."""

    def __init__(self, serve: bool = True) -> None:
        self.serve = serve
        self.built: list[list[layer_stack.PlainLayer]] = []
        self.calls: list[torch.Tensor | None] = []

    def __call__(self, plain):
        self.built.append(list(plain))
        layers = [lean(self._layer_of(p)) for p in plain]

        def stack(positions, hidden, residual):
            self.calls.append(residual)
            if not self.serve:
                return None
            for layer in layers:
                hidden, residual = layer(positions, hidden, residual)
            return hidden, residual

        return stack

    def _layer_of(self, plain):
        return self.model_layers[id(plain.input_norm)]


@pytest.fixture
def builder(monkeypatch):
    registered = _LayersInTurn()
    monkeypatch.setattr(layer_stack, "_BUILDERS", {"test": registered})
    return registered


def _with_layers(builder, model):
    builder.model_layers = {id(layer.input_layernorm): layer for layer in model.model.layers}
    return model


def _input_ids(model):
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, model.config.vocab_size, (NUM_TOKENS,), generator=generator)


def test_a_plain_layer_describes_its_own_parts():
    model = our_model(tiny_hf_model("LlamaForCausalLM"))
    layer = model.model.layers[0]
    plain = layer.plain()
    attention = layer.self_attn
    assert plain is not None
    assert plain.modules() == (
        layer.input_layernorm,
        attention.qkv_proj,
        attention.rotary_emb,
        attention.attn,
        attention.o_proj,
        layer.post_attention_layernorm,
        layer.mlp.gate_up_proj,
        layer.mlp.down_proj,
    )
    config = model.config
    assert (plain.num_heads, plain.num_kv_heads, plain.head_dim) == (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    assert (plain.q_size, plain.kv_size) == (
        config.num_attention_heads * config.head_dim,
        config.num_key_value_heads * config.head_dim,
    )


@pytest.mark.parametrize("case", NOT_PLAIN)
def test_a_layer_with_another_part_or_option_is_not_plain(case):
    model = _ours(NOT_PLAIN[case]())
    assert all(layer.plain() is None for layer in model.model.layers)


def test_registered_builders_are_named_by_their_providers(builder):
    assert layer_stack.providers() == ["test"]
    layer_stack.register_stack_builder("other", builder)
    assert layer_stack.providers() == ["test", "other"]


def test_a_registered_stack_runs_the_whole_stage_in_place_of_its_layers(builder, monkeypatch):
    hf_model = tiny_hf_model("LlamaForCausalLM")
    model, reference = _with_layers(builder, our_model(hf_model)), our_model(hf_model)
    input_ids = _input_ids(model)
    got = run_logits(model, input_ids)
    assert [len(b) for b in builder.built] == [len(model.model.layers)]
    assert builder.calls == [None]  # the stage's first layer gets no residual
    # The stack alone ran: a layer's own call is never made.
    calls = []
    monkeypatch.setattr(model.model, "_lean_layers", [lambda *a: calls.append(a)])
    assert torch.equal(run_logits(model, input_ids), got)
    assert calls == []
    monkeypatch.setattr(layer_stack, "_BUILDERS", {})
    assert torch.equal(got, run_logits(reference, input_ids))


def test_a_declined_step_runs_the_layers(builder):
    builder.serve = False
    hf_model = tiny_hf_model("LlamaForCausalLM")
    model = _with_layers(builder, our_model(hf_model))
    input_ids = _input_ids(model)
    got = run_logits(model, input_ids)
    assert len(builder.calls) == 1
    layer_stack._BUILDERS.clear()
    assert torch.equal(got, run_logits(our_model(hf_model), input_ids))


def test_the_stack_is_not_offered_a_step_while_a_hook_is_registered(builder):
    model = _with_layers(builder, our_model(tiny_hf_model("LlamaForCausalLM")))
    input_ids = _input_ids(model)
    run_logits(model, input_ids)  # the stack is made here
    seen = []
    down = model.model.layers[1].mlp.down_proj
    handle = down.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    run_logits(model, input_ids)
    handle.remove()
    run_logits(model, input_ids)
    assert len(builder.calls) == 2  # the first and the last forward
    assert seen == [torch.Size([NUM_TOKENS, model.config.intermediate_size])]


def test_no_stack_is_asked_for_where_a_layer_is_not_plain(builder):
    model = _ours(NOT_PLAIN["qwen3-qk-norm"]())
    run_logits(model, _input_ids(model))
    assert builder.built == []


def test_an_early_exit_runs_its_layers_not_the_stack(builder):
    model = _with_layers(builder, our_model(tiny_hf_model("LlamaForCausalLM")))
    run_logits(model, _input_ids(model))
    with torch.inference_mode(), set_forward_context(_bound(model)):
        model.model(_input_ids(model), torch.arange(NUM_TOKENS), num_layers=1)
    assert len(builder.calls) == 1
