"""GraphDispatcher: which steps replay which graphs, and what a replay reads and returns;
the padding of each kind of graph."""

from __future__ import annotations

import torch
from replay_graph import ReplayGraph

from core.attention.interface import CommonAttentionMetadata
from core.compilation.graph_dispatch import (
    BatchDescriptor,
    GraphDispatcher,
    capture_batch,
    pad_decode_batch,
    pad_tokens,
)
from core.config import CUDAGraphMode
from core.forward_context import ForwardContext, get_forward_context

CPU = torch.device("cpu")
FULL = CUDAGraphMode.FULL_DECODE_ONLY


def forward(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Reads its inputs and the context's metadata, as a model does."""
    scale = get_forward_context().attn_metadata["layer"]
    return (input_ids * 10 + positions)[:, None] * scale  # [T, 1]


def dispatcher(mode=FULL, scale=None, sizes=(1, 2, 4, 8)) -> GraphDispatcher:
    scale = torch.ones(()) if scale is None else scale
    graphs = GraphDispatcher(mode, ReplayGraph, forward, list(sizes), CPU)
    graphs.capture_all(lambda descriptor: ForwardContext({"layer": scale}, 0))
    return graphs


def test_pure_decodes_pad_up_to_the_next_capture_size():
    graphs = dispatcher()
    assert graphs.descriptor(num_reqs=3, num_tokens=3) == BatchDescriptor(4, True)
    assert graphs.descriptor(num_reqs=8, num_tokens=8) == BatchDescriptor(8, True)
    assert graphs.descriptor(num_reqs=1, num_tokens=1) == BatchDescriptor(1, True)


def test_full_decode_only_leaves_mixed_and_oversized_batches_to_run_without_graphs():
    graphs = dispatcher()
    assert graphs.descriptor(num_reqs=2, num_tokens=5) is None
    assert graphs.descriptor(num_reqs=9, num_tokens=9) is None


def test_piecewise_takes_any_batch_up_to_the_largest_size():
    graphs = dispatcher(CUDAGraphMode.PIECEWISE)
    assert graphs.descriptor(num_reqs=2, num_tokens=5) == BatchDescriptor(8, False)
    assert graphs.descriptor(num_reqs=3, num_tokens=3) == BatchDescriptor(4, False)
    assert graphs.descriptor(num_reqs=1, num_tokens=9) is None


def test_full_and_piecewise_gives_decodes_full_graphs_and_the_rest_pieces():
    graphs = dispatcher(CUDAGraphMode.FULL_AND_PIECEWISE)
    assert graphs.descriptor(num_reqs=3, num_tokens=3) == BatchDescriptor(4, True)
    assert graphs.descriptor(num_reqs=1, num_tokens=3) == BatchDescriptor(4, False)


def test_every_size_gets_one_full_graph():
    graphs = dispatcher(sizes=(4, 1, 2))
    assert sorted(d.num_tokens for d in graphs.full_descriptors) == [1, 2, 4]
    assert dispatcher(CUDAGraphMode.PIECEWISE).full_descriptors == []


def test_full_replay_reads_this_steps_inputs_and_the_persistent_metadata():
    scale = torch.ones(())
    graphs = dispatcher(scale=scale)
    scale.fill_(3.0)  # what a builder writing into its persistent buffer does
    out = graphs.run(BatchDescriptor(4, True), torch.tensor([1, 2, 3]), torch.tensor([5, 6, 7]))
    assert out.tolist() == [[45.0], [78.0], [111.0]]  # only the 3 real rows
    again = graphs.run(BatchDescriptor(2, True), torch.tensor([4]), torch.tensor([9]))
    assert again.tolist() == [[147.0]]


def test_piecewise_run_forwards_the_padded_static_inputs():
    graphs = dispatcher(CUDAGraphMode.PIECEWISE)
    with_context = ForwardContext({"layer": torch.tensor(2.0)}, 0)
    from core.forward_context import set_forward_context

    with set_forward_context(with_context):
        out = graphs.run(BatchDescriptor(4, False), torch.tensor([1, 2]), torch.tensor([3, 4]))
    assert out.tolist() == [[26.0], [48.0]]


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


def test_full_padding_adds_requests_without_tokens_or_context_that_write_nothing():
    padded = pad_decode_batch(common([5, 9], [[3, 4], [6, 7]], [20, 29]), 4, max_model_len=64)
    assert padded.query_start_loc.tolist() == [0, 1, 2, 2, 2]
    assert padded.seq_lens.tolist() == [5, 9, 0, 0]
    assert padded.num_computed_tokens.tolist() == [4, 8, 0, 0]
    assert padded.block_table.tolist() == [[3, 4], [6, 7], [0, 0], [0, 0]]
    assert padded.slot_mapping.tolist() == [20, 29, -1, -1]
    assert (padded.num_reqs, padded.num_actual_tokens) == (4, 4)
    assert (padded.max_query_len, padded.max_seq_len) == (1, 64)


def test_piecewise_padding_adds_token_rows_of_no_request():
    padded = pad_tokens(common([5, 9], [[3, 4], [6, 7]], [20, 29]), 4)
    assert padded.query_start_loc.tolist() == [0, 1, 2]
    assert padded.slot_mapping.tolist() == [20, 29, -1, -1]
    assert (padded.num_reqs, padded.num_actual_tokens, padded.max_seq_len) == (2, 4, 9)


def test_full_capture_batch_reads_the_null_block_and_writes_nothing():
    batch = capture_batch(BatchDescriptor(3, True), max_blocks=5, max_model_len=64, device=CPU)
    assert batch.query_start_loc.tolist() == [0, 1, 2, 3]
    assert batch.seq_lens.tolist() == [1, 1, 1]
    assert batch.block_table.tolist() == [[0] * 5] * 3
    assert batch.slot_mapping.tolist() == [-1, -1, -1]
    assert batch.max_seq_len == 64


def test_piecewise_capture_batch_has_tokens_of_no_request():
    batch = capture_batch(BatchDescriptor(3, False), max_blocks=5, max_model_len=64, device=CPU)
    assert (batch.num_reqs, batch.num_actual_tokens) == (0, 3)
    assert batch.query_start_loc.tolist() == [0]
    assert batch.slot_mapping.tolist() == [-1, -1, -1]
