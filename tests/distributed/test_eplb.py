"""Expert placement and its rebalancing (core.distributed.eplb), on one process: hot
experts take the redundant slots, experts are packed onto ranks by load, a token's
choice goes to one of its expert's replicas the same way on every rank, and the measured
imbalance is the most loaded rank over the mean."""

from __future__ import annotations

import pytest
import torch

from core.distributed.eplb import ExpertPlacement, imbalance, rebalance_experts


def test_hot_experts_take_the_redundant_slots_and_are_spread_over_ranks():
    load = torch.tensor([100.0, 90.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    placement = rebalance_experts(load, num_slots=10, num_ranks=2)
    assert sorted(placement.tolist()) == [0, 0, 1, 1, 2, 3, 4, 5, 6, 7]
    ranks = placement.view(2, 5).tolist()
    assert all(0 in rank and 1 in rank for rank in ranks)  # one replica of each per rank
    slot_load = load[placement] / torch.bincount(placement)[placement]
    assert imbalance(slot_load, 2) < 1.05


def test_without_redundant_slots_experts_are_packed_by_load():
    load = torch.tensor([8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    placement = rebalance_experts(load, num_slots=8, num_ranks=2)
    assert sorted(placement.tolist()) == list(range(8))
    per_rank = load[placement].view(2, 4).sum(dim=1)
    assert per_rank.tolist() == [18.0, 18.0]


def test_no_expert_gets_more_replicas_than_ranks():
    load = torch.tensor([1000.0, 1.0, 1.0, 1.0])
    placement = rebalance_experts(load, num_slots=8, num_ranks=2)
    assert torch.bincount(placement).tolist() == [2, 2, 2, 2]


def test_rebalancing_is_deterministic():
    load = torch.rand(16, generator=torch.Generator().manual_seed(0))
    first = rebalance_experts(load, num_slots=20, num_ranks=4)
    assert torch.equal(first, rebalance_experts(load.clone(), num_slots=20, num_ranks=4))


def test_a_choice_goes_to_one_replica_and_to_no_slot_on_another_rank():
    # 4 experts in 6 slots on 2 ranks: expert 0 in slots 0 and 3, expert 1 in 1 and 4.
    p2l = torch.tensor([0, 1, 2, 0, 1, 3])
    ids = torch.tensor([[0, 1], [0, 2], [3, 0]])
    rank0 = ExpertPlacement(p2l, 4, ep_rank=0, ep_size=2)
    rank1 = ExpertPlacement(p2l, 4, ep_rank=1, ep_size=2)
    physical, local0 = rank0.route(ids)
    assert torch.equal(physical, rank1.route(ids)[0])  # the same slots on every rank
    assert torch.equal(p2l[physical], ids)
    # Position p = token * K + k picks replica p mod replicas.
    assert physical.tolist() == [[0, 4], [0, 2], [5, 3]]
    assert local0.tolist() == [[0, -1], [0, 2], [-1, -1]]
    assert rank1.route(ids)[1].tolist() == [[-1, 1], [-1, -1], [2, 0]]


def test_a_placement_without_a_slot_for_some_expert_is_refused():
    with pytest.raises(ValueError, match="every expert needs a slot"):
        ExpertPlacement(torch.tensor([0, 1, 1, 0]), 3, ep_rank=0, ep_size=1)


def test_imbalance_is_the_busiest_rank_over_the_mean():
    assert imbalance(torch.tensor([4.0, 4.0, 0.0, 0.0]), 2) == 2.0
    assert imbalance(torch.tensor([1.0, 3.0, 2.0, 2.0]), 2) == 1.0
    assert imbalance(torch.zeros(4), 2) == 1.0


class _Layer:
    """What EplbState needs of a mixture-of-experts layer: a placement, the pending load
    it adds to, and the moves it is asked to make."""

    def __init__(self, num_experts: int, ep_size: int) -> None:
        self.placement = ExpertPlacement.initial(num_experts, num_experts, 0, ep_size)
        self.pending_load = torch.zeros(num_experts)
        self.moves: list[list[int]] = []

    def move_experts(self, physical_to_logical: torch.Tensor, group) -> None:
        self.placement.set(physical_to_logical)
        self.moves.append(physical_to_logical.tolist())


class _TwoRanks:
    """Rank 0 of a two-rank group whose broadcast is rank 0's own placement and whose
    other rank counts the same loads again (its share of the tokens routed alike)."""

    world_size, rank_in_group = 2, 0

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        return t

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return t * 2


def test_the_window_keeps_the_last_steps_and_the_interval_rearranges():
    from core.config import EPLBConfig
    from core.distributed.eplb import EplbState

    layer = _Layer(num_experts=4, ep_size=2)  # experts 0, 1 on rank 0; 2, 3 on rank 1
    state = EplbState([layer], EPLBConfig(window_size=2, step_interval=4), _TwoRanks())
    for load in ([0, 0, 4, 0], [2, 0, 0, 0], [2, 2, 0, 0]):
        layer.pending_load += torch.tensor(load, dtype=torch.float32)
        state.step()
    # Both ranks' counts summed; the first step left the window: rank 0's experts got
    # all 12 tokens of the last two.
    assert state.sums[0].tolist() == [8.0, 4.0, 0.0, 0.0] and state.imbalance() == 2.0
    layer.pending_load += torch.tensor([2.0, 0.0, 0.0, 0.0])
    state.step()  # the fourth: the window (steps 3 and 4) [8, 4, 0, 0] is rearranged
    assert state.history == [2.0]
    assert layer.moves[-1] == [0, 3, 1, 2]  # the two loaded experts on different ranks
    assert state.sums.sum() == 0 and state.imbalance() == 1.0  # a new window


def test_one_rank_with_its_experts_reordered_still_routes_through_the_map():
    placement = ExpertPlacement.initial(4, 4, ep_rank=0, ep_size=1)
    assert placement.is_identity
    placement.set(torch.tensor([2, 0, 1, 3]))
    assert not placement.is_identity
    physical, local = placement.route(torch.tensor([[0, 2]]))
    assert physical.tolist() == local.tolist() == [[1, 0]]
