"""Conformance of a model architecture (`--core-conformance=model:ARCHITECTURE`).

A tiny random-weight checkpoint of the architecture is written with transformers (two
layers, hidden size 64, 4 query and 2 KV heads of 16, vocabulary 256) as a Hugging Face
directory, loaded through core (safetensors checkpoint, ArchConfig, the registered class
built as `cls(arch_config, quant_config=None, dtype=float32)`, `load_weights`), and run
on the reference attention backend over a paged KV cache: a prompt in two chunks, then
two decode steps. Its logits at every position must match transformers' in float32
within 1e-4 of the logit scale (max |logit|), the parity rule of core's own models.
An architecture transformers does not know is skipped with that reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from core.attention.backends.torch_ref import TorchRefBackend, bind_reference_backend
from core.attention.interface import CommonAttentionMetadata
from core.forward_context import ForwardContext, set_forward_context
from core.model_loader.safetensors_loader import load_safetensors_checkpoint
from core.models import ArchConfig, iter_attention_layers
from core.testing.plugin import targets_of
from core.testing.targets import Target

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)
# What an architecture needs beyond TINY (transformers' defaults would not run it small).
ARCHITECTURE_SETTINGS = {
    "DeepseekV2ForCausalLM": dict(
        num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16,
        qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
        topk_method="group_limited_greedy", n_group=2, topk_group=1,
    ),
}  # fmt: skip
STEPS = (7, 5, 1, 1)  # new tokens per step: two prompt chunks, two decodes
BLOCK_SIZE, BLOCK_IDS = 4, [3, 1, 4, 2]  # blocks of the sequence, out of order
PARITY = 1e-4


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    params = [pytest.param(t, id=t.id) for t in targets_of(metafunc.config, "model")]
    metafunc.parametrize("target", params)


def architecture(target: Target) -> str:
    """The HF architecture: the entry name, or the referenced class's name."""
    return target.value.__name__ if target.spec.is_reference else target.spec.name


@pytest.fixture
def hf_model(target: Target, tmp_path: Path) -> Any:
    """A random transformers model of the architecture, also saved to tmp_path."""
    transformers = pytest.importorskip("transformers")
    name = architecture(target)
    hf_class = getattr(transformers, name, None)
    if hf_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name} to compare with")
    settings = {**TINY, **ARCHITECTURE_SETTINGS.get(name, {})}
    config = hf_class.config_class(**settings, architectures=[name])
    if config.pad_token_id is not None and config.pad_token_id >= TINY["vocab_size"]:
        config.pad_token_id = None  # a full-size default (Phi-3's 32000) outside TINY's vocab
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = hf_class(config).eval()
    with torch.no_grad():
        for param in model.parameters():  # norms start at 1 and biases at 0: make them distinct
            param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(tmp_path, safe_serialization=True)
    return model


def test_logits_match_transformers(target: Target, hf_model: Any, tmp_path: Path) -> None:
    checkpoint = load_safetensors_checkpoint(tmp_path)
    model = target.value(ArchConfig.from_hf(checkpoint.hf_config), None, torch.float32)
    model.load_weights(checkpoint.iter_weights(torch.float32))
    input_ids = torch.randint(0, TINY["vocab_size"], (sum(STEPS),), generator=torch.Generator())
    got = run_paged(model, input_ids)
    with torch.inference_mode():
        want = hf_model(input_ids[None]).logits[0]  # [T, vocab]
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    assert diff <= PARITY * scale, (
        f"max |logit diff| {diff:.3g} > {PARITY} x max |logit| {scale:.3g}"
    )


def run_paged(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits [T, vocab] of one sequence run step by step over a paged KV cache."""
    layers = list(iter_attention_layers(model))
    num_blocks = max(BLOCK_IDS) + 1
    for layer in layers:
        bind_reference_backend(layer, num_blocks, BLOCK_SIZE)
    logits, start = [], 0
    for count in STEPS:
        positions = torch.arange(start, start + count)
        common = _common_metadata(start, count)
        metadata = {
            layer.layer_name: TorchRefBackend.get_builder_cls()(
                layer.kv_cache_spec(BLOCK_SIZE, torch.float32),
                [layer.layer_name],
                torch.device("cpu"),
            ).build(common)
            for layer in layers
        }
        with torch.inference_mode(), set_forward_context(ForwardContext(metadata, count)):
            logits.append(model.compute_logits(model(input_ids[positions], positions)))
        start += count
    return torch.cat(logits)


def _common_metadata(num_computed: int, count: int) -> CommonAttentionMetadata:
    seq_len = num_computed + count
    slots = [
        BLOCK_IDS[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
        for p in range(num_computed, seq_len)
    ]
    return CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, count], dtype=torch.int32),
        seq_lens=torch.tensor([seq_len], dtype=torch.int32),
        num_computed_tokens=torch.tensor([num_computed], dtype=torch.int32),
        block_table=torch.tensor([BLOCK_IDS], dtype=torch.int32),
        slot_mapping=torch.tensor(slots),
        num_reqs=1,
        num_actual_tokens=count,
        max_query_len=count,
        max_seq_len=seq_len,
    )
