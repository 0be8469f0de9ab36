"""`--quantization gguf`: GGUF matrices stay in their blocks (core's packed layout), exactly
the weights the dequantizing path loads, in a fraction of the memory."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from determinism import assert_greedy_equivalent
from gguf import GGMLQuantizationType as Q
from tiny_checkpoints import tiny_model, write_gguf_model

from core import LLM, SamplingParams
from core.model_loader import resolve_model
from core.model_loader.gguf_dequant import PACKED_TYPES, random_blocks, to_packed
from core.model_loader.gguf_quantization import GGUFConfig
from core.models import build_model
from core.models.calibration import forward_sequence
from core.models.layers import MergedLinear, TiedLMHead, VocabEmbedding
from core.quantization.packed import stored


def reference_dequantize(raw: torch.Tensor, qtype: Q) -> torch.Tensor:
    """gguf-py's own numpy decoder: independent of core's."""
    return torch.from_numpy(gguf.quants.dequantize(raw.numpy(), qtype).astype(np.float32))


def load(layer, shards: list[tuple[Q, torch.Tensor]]) -> None:
    for index, (qtype, raw) in enumerate(shards):
        shard = None if len(shards) == 1 else index
        layer.qweight_type.weight_loader(layer.qweight_type, torch.tensor(int(qtype)), shard)
        layer.qweight.weight_loader(layer.qweight, raw, shard)
    layer.linear_method.process_weights_after_loading(layer)


@pytest.mark.parametrize("qtype", sorted(PACKED_TYPES), ids=lambda t: t.name)
def test_packed_blocks_dequantize_to_gguf_pys_floats(qtype):
    raw = random_blocks(qtype, 5, 512, torch.Generator().manual_seed(int(qtype)))
    packed = to_packed(raw, qtype, 512)
    assert packed.bits == (4 if qtype in (Q.Q4_0, Q.Q4_1, Q.Q4_K) else 8)
    assert torch.equal(packed.dequantize(), reference_dequantize(raw, qtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_shards_of_different_types_are_held_exactly(dtype):
    generator = torch.Generator().manual_seed(0)
    shards = [(Q.Q4_K, random_blocks(Q.Q4_K, 40, 512, generator)), (Q.Q6_K, None)]
    shards[1] = (Q.Q6_K, random_blocks(Q.Q6_K, 24, 512, generator))
    layer = MergedLinear(512, [40, 24], quant_config=GGUFConfig(), prefix="mlp", dtype=dtype)
    load(layer, shards)
    packed = stored(layer)
    assert (packed.bits, packed.group_size) == (8, 16)  # Q6_K's: the widest, the finest
    assert [name for name, _ in layer.named_parameters()] == []  # the bytes were converted
    weight = torch.cat([reference_dequantize(raw, qtype) for qtype, raw in shards])
    assert torch.equal(layer.linear_method.dequantize(layer).float(), weight.to(dtype).float())
    for tokens in (1, 3, 9):
        x = torch.randn(tokens, 512, generator=generator).to(dtype)
        reference = x.double() @ weight.double().T
        scale = (x.double().abs() @ weight.double().abs().T).max()
        tolerance = 1e-6 if dtype == torch.float32 else 1e-2
        assert (layer(x).double() - reference).abs().max() <= tolerance * scale


def test_a_float_shard_holds_the_layer_dense():
    generator = torch.Generator().manual_seed(1)
    shards = [(Q.F16, random_blocks(Q.F16, 8, 64, generator))]
    shards.append((Q.Q8_0, random_blocks(Q.Q8_0, 16, 64, generator)))
    layer = MergedLinear(64, [8, 16], quant_config=GGUFConfig(), prefix="mlp")
    load(layer, shards)
    assert stored(layer) is None
    want = torch.cat([raw.view(torch.float16).float() for _, raw in shards[:1]])
    want = torch.cat([want, reference_dequantize(shards[1][1], Q.Q8_0)])
    assert torch.equal(layer.dense_weight, want)


def test_embedding_and_tied_head_read_the_packed_matrix():
    raw = random_blocks(Q.Q8_0, 100, 64, torch.Generator().manual_seed(2))
    embedding = VocabEmbedding(100, 64, torch.float32, GGUFConfig())
    load(embedding, [(Q.Q8_0, raw)])
    weight = reference_dequantize(raw, Q.Q8_0)
    ids = torch.tensor([3, 99, 0, 3])
    assert torch.equal(embedding(ids), weight[ids])
    hidden = torch.randn(2, 64)
    torch.testing.assert_close(TiedLMHead(embedding)(hidden), hidden @ weight.T)


def test_loaders_name_what_is_wrong():
    layer = MergedLinear(64, [8, 16], quant_config=GGUFConfig(), prefix="mlp")
    raw = random_blocks(Q.Q4_0, 8, 64, torch.Generator())
    with pytest.raises(ValueError, match="qweight_type must be loaded before qweight"):
        layer.qweight.weight_loader(layer.qweight, raw, 0)
    with pytest.raises(ValueError, match="999 is not a GGML tensor type"):
        layer.qweight_type.weight_loader(layer.qweight_type, torch.tensor(999), 0)
    layer.qweight_type.weight_loader(layer.qweight_type, torch.tensor(int(Q.Q4_0)), 1)
    with pytest.raises(ValueError, match=r"Q4_0 bytes of shape \(8, 36\).*\[16, 64\] matrix"):
        layer.qweight.weight_loader(layer.qweight, raw, 1)
    with pytest.raises(ValueError, match="mlp: the checkpoint gave no weight for shard 0"):
        layer.linear_method.process_weights_after_loading(layer)


def test_tiny_gguf_kept_in_blocks_computes_what_the_dequantized_model_does(tmp_path):
    model = tiny_model("llama")
    types = {"blk.0.attn_q.weight": Q.Q4_0, "blk.0.attn_k.weight": Q.Q8_0}
    types |= {"blk.0.attn_v.weight": Q.Q4_1, "blk.1.attn_q.weight": Q.Q4_0}
    types |= {"token_embd.weight": Q.Q8_0, "blk.0.ffn_down.weight": Q.Q4_1}
    checkpoint = resolve_model(str(write_gguf_model(tmp_path / "tiny.gguf", model, types)))
    packed, dense = build_model(checkpoint, GGUFConfig()), build_model(checkpoint)
    layers = packed.model.layers
    assert stored(layers[0].self_attn.qkv_proj).bits == 8  # Q4_0, Q8_0, Q4_1 shards
    assert stored(layers[0].mlp.down_proj).bits == 4
    assert stored(layers[1].self_attn.qkv_proj) is None  # F32 k and v: held dense
    ids = torch.randint(0, 128, (23,), generator=torch.Generator().manual_seed(3))
    got = packed.compute_logits(forward_sequence(packed, ids))
    want = dense.compute_logits(forward_sequence(dense, ids))
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def resident_bytes(model: torch.nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.slow
def test_default_model_kept_in_blocks_fits_in_1_3x_its_file():
    checkpoint = resolve_model(None)
    size = checkpoint.path.stat().st_size
    model = build_model(checkpoint, GGUFConfig())
    resident = resident_bytes(model)
    print(f"resident weights {resident / 2**20:.1f} MiB, file {size / 2**20:.1f} MiB")
    assert resident <= 1.3 * size


PROMPTS = [
    "The river wound slowly through the valley,",
    "Write a short poem about the sea.",
    "def merge_sorted(a, b):",
    "Three facts about the moon:",
    "Translate to French: the cat sleeps on the warm windowsill.",
    "List the planets of the solar system in order:",
]


@pytest.mark.slow
def test_default_model_kept_in_blocks_generates_as_dequantized():
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    runs = {}
    for quantization in ("gguf", "none"):
        llm = LLM(quantization=quantization, dtype="float32", max_model_len=512,
                  kv_cache_memory="64MiB")  # fmt: skip
        runs[quantization] = [
            out.outputs[0].token_ids for out in llm.generate(PROMPTS, params, use_tqdm=False)
        ]
        tokenizer = llm.get_tokenizer()
    dequantized = build_model(resolve_model(None))

    def reference_logits(tokens: list[int]) -> torch.Tensor:
        hidden = forward_sequence(dequantized, torch.tensor(tokens))[-1:]
        return dequantized.compute_logits(hidden)[0]

    for prompt, ours, reference in zip(PROMPTS, runs["gguf"], runs["none"], strict=True):
        context = tokenizer.encode(prompt)
        assert_greedy_equivalent(ours, reference, reference_logits, context, label=prompt)
