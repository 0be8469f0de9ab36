"""LinearPartition: each tensor-parallel rank's share of a linear layer's W."""

from __future__ import annotations

import pytest

from core.models.layers import MergedLinear, QKVLinear, ReplicatedLinear, RowParallelLinear
from core.quantization import LinearPartition, LinearSplit

QKV = (64, 16, 16)  # q, k, v outputs of a GQA projection


@pytest.mark.parametrize(
    ("tp_size", "expected"), [(1, (64, 16, 16)), (2, (32, 8, 8)), (4, (16, 4, 4))]
)
def test_column_split_divides_every_fused_output(tp_size, expected):
    for rank in range(tp_size):
        part = LinearPartition(48, QKV, LinearSplit.COLUMN, tp_rank=rank, tp_size=tp_size)
        assert part.output_sizes_per_partition == expected
        assert part.input_size_per_partition == 48


@pytest.mark.parametrize(("tp_size", "expected"), [(1, 96), (2, 48), (4, 24)])
def test_row_split_divides_the_input(tp_size, expected):
    part = LinearPartition(96, (40,), LinearSplit.ROW, tp_rank=tp_size - 1, tp_size=tp_size)
    assert part.input_size_per_partition == expected
    assert part.output_sizes_per_partition == (40,)


def test_replicated_layer_is_whole_on_every_rank():
    part = LinearPartition(30, (10, 6), LinearSplit.REPLICATED, tp_rank=3, tp_size=4)
    assert (part.input_size_per_partition, part.output_sizes_per_partition) == (30, (10, 6))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((48, (64, 18, 18), LinearSplit.COLUMN, 0, 4), r"output_sizes\[1\] = 18 .* tp_size 4"),
        ((90, (40,), LinearSplit.ROW, 1, 4), "input_size 90 does not divide into tp_size 4"),
        ((48, QKV, LinearSplit.COLUMN, 2, 2), "tp_rank 2 is not a rank of tp_size 2"),
        ((48, QKV, LinearSplit.COLUMN, 0, 0), "tp_rank 0 is not a rank of tp_size 0"),
        ((48, (), LinearSplit.COLUMN, 0, 1), "must be positive"),
    ],
)
def test_sizes_that_do_not_split_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        LinearPartition(*args)


def test_layers_hold_the_whole_layer_as_rank_0_of_1():
    qkv = QKVLinear(48, head_dim=8, num_heads=8, num_kv_heads=2)
    assert qkv.partition == LinearPartition(48, QKV, LinearSplit.COLUMN)
    assert (qkv.q_size, qkv.kv_size) == (64, 16)
    assert MergedLinear(48, [20, 20]).partition.split is LinearSplit.COLUMN
    assert RowParallelLinear(20, 48).partition.split is LinearSplit.ROW
    assert ReplicatedLinear(20, 48).partition.split is LinearSplit.REPLICATED
