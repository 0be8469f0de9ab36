"""Each tensor-parallel rank builds and loads only its share of the model (one process,
ranks faked with patch_tensor_parallel): the slices of every checkpoint tensor it holds,
checked against transformers' weights, and heads / vocabulary split as the ranks need."""

from __future__ import annotations

import pytest
import torch
from tp_checkpoint import tp_model, write_tp_checkpoint

from core.distributed.parallel_state import patch_tensor_parallel
from core.engine.processor import EngineSetup
from core.engine_args import EngineArgs
from core.model_loader import resolve_model
from core.models.registry import build_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = tp_model()
    directory = write_tp_checkpoint(tmp_path_factory.mktemp("tp"), model)
    return resolve_model(str(directory)), dict(model.named_parameters())


def rank_model(checkpoint, rank: int, world_size: int):
    with patch_tensor_parallel(rank, world_size):
        return dict(build_model(checkpoint[0]).named_parameters()), checkpoint[1]


def rows(t: torch.Tensor, rank: int, parts: int) -> torch.Tensor:
    return t.chunk(parts, dim=0)[rank]


@pytest.mark.parametrize("rank", [0, 1])
def test_two_ranks_hold_their_halves_of_every_weight(checkpoint, rank) -> None:
    ours, hf = rank_model(checkpoint, rank, 2)
    layer = "model.layers.1"
    q, k, v = (hf[f"{layer}.self_attn.{n}_proj.weight"] for n in "qkv")
    want_qkv = torch.cat([rows(q, rank, 2), rows(k, rank, 2), rows(v, rank, 2)])
    assert torch.equal(ours[f"{layer}.self_attn.qkv_proj.weight"], want_qkv)
    o = hf[f"{layer}.self_attn.o_proj.weight"]
    assert torch.equal(ours[f"{layer}.self_attn.o_proj.weight"], o.chunk(2, dim=1)[rank])
    gate, up = hf[f"{layer}.mlp.gate_proj.weight"], hf[f"{layer}.mlp.up_proj.weight"]
    want_gate_up = torch.cat([rows(gate, rank, 2), rows(up, rank, 2)])
    assert torch.equal(ours[f"{layer}.mlp.gate_up_proj.weight"], want_gate_up)
    down = hf[f"{layer}.mlp.down_proj.weight"]
    assert torch.equal(ours[f"{layer}.mlp.down_proj.weight"], down.chunk(2, dim=1)[rank])
    embed = hf["model.embed_tokens.weight"]
    assert torch.equal(ours["model.embed_tokens.weight"], rows(embed, rank, 2))
    assert torch.equal(ours["lm_head.weight"], rows(hf["lm_head.weight"], rank, 2))
    assert torch.equal(ours["model.norm.weight"], hf["model.norm.weight"])  # replicated


def test_each_rank_holds_a_share_of_the_weights(checkpoint) -> None:
    whole, _ = rank_model(checkpoint, 0, 1)
    half, _ = rank_model(checkpoint, 1, 2)
    norms = sum(p.numel() for n, p in whole.items() if "norm" in n)
    total = sum(p.numel() for p in whole.values())
    assert sum(p.numel() for p in half.values()) == (total - norms) // 2 + norms


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_fewer_kv_heads_than_ranks_replicates_them(checkpoint, rank) -> None:
    """4 ranks, 2 KV heads: ranks 0-1 hold KV head 0, ranks 2-3 head 1; one query head each."""
    ours, hf = rank_model(checkpoint, rank, 4)
    layer = "model.layers.0.self_attn"
    q, k, v = (hf[f"{layer}.{n}_proj.weight"] for n in "qkv")
    head = rank // 2
    want = torch.cat([rows(q, rank, 4), rows(k, head, 2), rows(v, head, 2)])
    assert torch.equal(ours[f"{layer}.qkv_proj.weight"], want)


def test_tp_that_does_not_divide_the_heads_is_refused_before_any_process() -> None:
    """The default model has 9 heads and 3 KV heads."""
    with pytest.raises(ValueError, match=r"--tensor-parallel-size 2 does not divide the 9"):
        EngineSetup.from_engine_args(EngineArgs(tensor_parallel_size=2))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (dict(tensor_parallel_size=2, distributed_executor_backend="uni"), "use mp"),
        (dict(pipeline_parallel_size=2, enable_lora=True), "--enable-lora with pipeline"),
        (dict(pipeline_parallel_size=40), "--pipeline-parallel-size 40 is more than"),
        (dict(tensor_parallel_size=3, quantization="gguf"), "'gguf' weights cannot be split"),
    ],
)
def test_unbuilt_parallel_settings_are_refused_naming_the_flag(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        EngineSetup.from_engine_args(EngineArgs(**args))


def test_pipeline_stages_split_the_layers_evenly_earlier_ones_taking_fewer() -> None:
    from core.models.pipeline import stage_layers

    assert [stage_layers(30, s, 2) for s in range(2)] == [(0, 15), (15, 30)]
    assert [stage_layers(5, s, 3) for s in range(3)] == [(0, 1), (1, 3), (3, 5)]
    with pytest.raises(ValueError, match="--pipeline-parallel-size 3 is more than the model's 2"):
        stage_layers(2, 0, 3)


def test_a_vocabulary_that_does_not_divide_is_padded_with_zero_rows(tmp_path) -> None:
    """The kit's tiny model has 51 tokens: with 2 ranks, rank 1 holds rows 26-50 and one
    zero row, and the logits it gathers are cut back to 51."""
    from core.testing.tiny_checkpoint import reference_model, write_tiny_checkpoint

    model = reference_model()
    checkpoint = resolve_model(str(write_tiny_checkpoint(tmp_path, model)))
    hf = dict(model.named_parameters())["model.embed_tokens.weight"]
    assert hf.shape[0] == 51
    with patch_tensor_parallel(1, 2):
        ours = build_model(checkpoint).model.embed_tokens
    assert torch.equal(ours.weight[:25], hf[26:]) and not ours.weight[25].any()
    assert ours.vocab_rows == (26, 26) and ours.vocab_size == 51
