"""DecodeGraphs: which batches replay which graph, and what a replay reads and returns."""

from __future__ import annotations

import torch
from replay_graph import ReplayGraph

from core.attention.interface import CommonAttentionMetadata
from core.compilation.decode_graphs import (
    BatchDescriptor,
    DecodeGraphs,
    capture_batch,
    pad_decode_batch,
)
from core.forward_context import ForwardContext, get_forward_context

CPU = torch.device("cpu")


def forward(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Reads its inputs and the context's metadata, as a model does."""
    scale = get_forward_context().attn_metadata["layer"]
    return (input_ids * 10 + positions)[:, None] * scale  # [T, 1]


def graphs_with(scale: torch.Tensor, sizes=(1, 2, 4, 8)) -> DecodeGraphs:
    graphs = DecodeGraphs(ReplayGraph, forward, list(sizes), CPU)
    graphs.capture_all(lambda size: ForwardContext({"layer": scale}, size))
    return graphs


def test_pure_decodes_pad_up_to_the_next_capture_size():
    graphs = graphs_with(torch.ones(()))
    assert graphs.descriptor(num_reqs=3, num_tokens=3) == BatchDescriptor(4)
    assert graphs.descriptor(num_reqs=8, num_tokens=8) == BatchDescriptor(8)
    assert graphs.descriptor(num_reqs=1, num_tokens=1) == BatchDescriptor(1)


def test_mixed_batches_and_batches_past_the_largest_size_run_without_a_graph():
    graphs = graphs_with(torch.ones(()))
    assert graphs.descriptor(num_reqs=2, num_tokens=5) is None
    assert graphs.descriptor(num_reqs=9, num_tokens=9) is None


def test_every_size_is_captured_once():
    graphs = graphs_with(torch.ones(()), sizes=(4, 1, 2))
    assert sorted(d.num_tokens for d in graphs.descriptors) == [1, 2, 4]


def test_replay_reads_this_steps_inputs_and_the_persistent_metadata():
    scale = torch.ones(())
    graphs = graphs_with(scale)
    scale.fill_(3.0)  # what a builder writing into its persistent buffer does
    out = graphs.replay(BatchDescriptor(4), torch.tensor([1, 2, 3]), torch.tensor([5, 6, 7]))
    assert out.tolist() == [[45.0], [78.0], [111.0]]  # only the 3 real rows
    again = graphs.replay(BatchDescriptor(2), torch.tensor([4]), torch.tensor([9]))
    assert again.tolist() == [[147.0]]


def common(
    seq_lens: list[int], blocks: list[list[int]], slots: list[int]
) -> CommonAttentionMetadata:
    n = len(seq_lens)
    return CommonAttentionMetadata(
        query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor(seq_lens, dtype=torch.int32) - 1,
        block_table=torch.tensor(blocks, dtype=torch.int32),
        slot_mapping=torch.tensor(slots),
        num_reqs=n,
        num_actual_tokens=n,
        max_query_len=1,
        max_seq_len=max(seq_lens),
    )


def test_padding_adds_requests_without_tokens_or_context_that_write_nothing():
    padded = pad_decode_batch(common([5, 9], [[3, 4], [6, 7]], [20, 29]), 4, max_model_len=64)
    assert padded.query_start_loc.tolist() == [0, 1, 2, 2, 2]
    assert padded.seq_lens.tolist() == [5, 9, 0, 0]
    assert padded.num_computed_tokens.tolist() == [4, 8, 0, 0]
    assert padded.block_table.tolist() == [[3, 4], [6, 7], [0, 0], [0, 0]]
    assert padded.slot_mapping.tolist() == [20, 29, -1, -1]
    assert (padded.num_reqs, padded.num_actual_tokens) == (4, 4)
    assert (padded.max_query_len, padded.max_seq_len) == (1, 64)


def test_capture_batch_reads_the_null_block_and_writes_nothing():
    batch = capture_batch(3, max_blocks=5, max_model_len=64, device=CPU)
    assert batch.query_start_loc.tolist() == [0, 1, 2, 3]
    assert batch.seq_lens.tolist() == [1, 1, 1]
    assert batch.block_table.tolist() == [[0] * 5] * 3
    assert batch.slot_mapping.tolist() == [-1, -1, -1]
    assert batch.max_seq_len == 64
