"""KVOutputAggregator: under tensor parallelism a transfer is done once every rank has
reported it, in whatever steps they do, and failed if any rank's failed."""

from __future__ import annotations

from core.kv_transfer.aggregator import KVOutputAggregator
from core.kv_transfer.interface import KVConnectorOutput


def test_a_transfer_is_done_only_once_every_rank_reported_it():
    gather = KVOutputAggregator(world_size=2)
    done = KVConnectorOutput(finished_recving={"a"}, finished_sending={"s"})
    step = gather.aggregate([done, KVConnectorOutput()])
    assert step.finished_recving == set() and step.finished_sending == set()
    done = KVConnectorOutput(finished_recving={"a"}, finished_sending={"s"})
    step = gather.aggregate([KVConnectorOutput(), done])
    assert step.finished_recving == {"a"} and step.finished_sending == {"s"}
    assert step.failed_recving == set()
    step = gather.aggregate([KVConnectorOutput(), KVConnectorOutput()])
    assert step.finished_recving == set() and step.finished_sending == set()  # reported once


def test_a_receive_one_rank_failed_fails_when_the_last_rank_reports():
    gather = KVOutputAggregator(world_size=3)
    first = gather.aggregate([KVConnectorOutput(failed_recving={"r"}),
                              KVConnectorOutput(finished_recving={"r"}), None])  # fmt: skip
    assert first.finished_recving == set()
    last = gather.aggregate([None, None, KVConnectorOutput(finished_recving={"r"})])
    assert last.finished_recving == {"r"} and last.failed_recving == {"r"}
    again = gather.aggregate([KVConnectorOutput(finished_recving={"r"})] * 3)
    assert again.finished_recving == {"r"} and again.failed_recving == set()  # a new load


def test_what_moved_adds_the_ranks_bytes_and_times_and_counts_the_blocks_once():
    outputs = [KVConnectorOutput(), KVConnectorOutput()]
    for rank, output in enumerate(outputs):
        output.count_moved(4, 1000, 0.1 * (rank + 1))
    step = KVOutputAggregator(world_size=2).aggregate(outputs)
    assert (step.num_blocks_moved, step.num_bytes_moved) == (4, 2000)
    assert step.transfer_times == [0.1, 0.2]


def test_blocks_the_ranks_move_in_different_steps_count_once():
    gather = KVOutputAggregator(world_size=2)
    first, second = KVConnectorOutput(), KVConnectorOutput()
    first.count_moved(4, 1000, 0.1)
    second.count_moved(4, 1000, 0.1)
    moved = [gather.aggregate([first, None]), gather.aggregate([KVConnectorOutput(), second])]
    assert sum(step.num_blocks_moved for step in moved) == 4
    assert sum(step.num_bytes_moved for step in moved) == 2000
