"""Expert placement and expert-parallel load balancing (EPLB).

Under --enable-expert-parallel the E logical experts of each mixture-of-experts layer
live in P physical slots, P / ep_size per rank (P = E + the redundant slots of
--eplb-config). `ExpertPlacement` says which logical expert each slot holds
(`physical_to_logical`) and routes a token's logical choice to one of that expert's
replicas: replica (token * K + k) mod replicas, the same on every rank.

`EplbState` (--enable-eplb) counts each slot's tokens per forward step over a window of
`window_size` steps: each rank counts its share of its engine's tokens, and a step's
counts are summed over the expert-parallel group (one all-reduce), so every rank holds
the same window. Every `step_interval` steps it rearranges every layer: the loads of
the window, per logical expert, go to `rebalance_experts` (hot experts get the redundant
slots, then experts are packed onto ranks by load), the new placement is broadcast from
the first rank (every rank then holds the same one), and each rank copies its new
slots' weights from where they were (one all-gather of the layer's experts). Outputs do
not change: a replica's weights are its expert's.

The measured imbalance of a window is, per layer, the most tokens any rank's slots got
divided by the mean over ranks (1.0 is perfect balance), averaged over the layers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from core.config import EPLBConfig
from core.distributed.parallel_state import GroupCoordinator

logger = logging.getLogger(__name__)


@dataclass
class ExpertPlacement:
    """The logical expert of every physical slot of one layer, and this rank's slots."""

    physical_to_logical: torch.Tensor  # [P] int64
    num_experts: int  # E, logical
    ep_rank: int
    ep_size: int
    _logical_to_physical: torch.Tensor = field(init=False, repr=False)  # [E, max replicas]
    _replicas: torch.Tensor = field(init=False, repr=False)  # [E]
    _identity: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.set(self.physical_to_logical)

    @classmethod
    def initial(
        cls, num_experts: int, num_slots: int, ep_rank: int, ep_size: int
    ) -> ExpertPlacement:
        """Slot s holds expert s mod E: each expert once, the first ones again in the
        redundant slots."""
        return cls(torch.arange(num_slots) % num_experts, num_experts, ep_rank, ep_size)

    @property
    def num_slots(self) -> int:
        return self.physical_to_logical.numel()

    @property
    def num_local(self) -> int:
        return self.num_slots // self.ep_size

    @property
    def first_local(self) -> int:
        return self.ep_rank * self.num_local

    @property
    def is_identity(self) -> bool:
        """One rank whose slot e holds expert e: routing has nothing to map."""
        return self._identity

    def local_experts(self) -> list[int]:
        """The logical expert of each of this rank's slots, in slot order."""
        start = self.first_local
        return self.physical_to_logical[start : start + self.num_local].tolist()

    def set(self, physical_to_logical: torch.Tensor) -> None:
        """Take a new placement (every expert must keep at least one slot)."""
        p2l = physical_to_logical.long()
        replicas = torch.bincount(p2l, minlength=self.num_experts)
        if replicas.numel() != self.num_experts or int(replicas.min()) < 1:
            raise ValueError("every expert needs a slot in the placement")
        table = torch.full((self.num_experts, int(replicas.max())), -1, dtype=torch.long)
        for expert in range(self.num_experts):
            slots = (p2l == expert).nonzero().squeeze(1)
            table[expert, : slots.numel()] = slots
        self.physical_to_logical = p2l
        self._logical_to_physical, self._replicas = table, replicas
        self._identity = self.ep_size == 1 and torch.equal(p2l, torch.arange(self.num_experts))

    def route(self, topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(physical slot [T, K] of each choice, its local slot on this rank or -1)."""
        ids = topk_ids.long()
        position = torch.arange(ids.numel(), device=ids.device).view(ids.shape)
        replica = position % self._replicas[ids]
        physical = self._logical_to_physical[ids, replica]
        local = physical - self.first_local
        local = torch.where((local >= 0) & (local < self.num_local), local, -1)
        return physical, local


def rebalance_experts(load: torch.Tensor, num_slots: int, num_ranks: int) -> torch.Tensor:
    """A placement [num_slots] (the logical expert of each slot) for logical `load` [E].

    The redundant slots go one at a time to the expert with the most load per replica (at
    most one replica per rank); then the replicas, heaviest first (each carries its
    expert's load / replicas), go to the least-loaded rank with a free slot that does not
    hold that expert yet. Deterministic: ties go to the lower expert and rank.
    """
    num_experts = load.numel()
    per_rank = num_slots // num_ranks
    load = load.double()
    replicas = torch.ones(num_experts, dtype=torch.long)
    for _ in range(num_slots - num_experts):
        share = torch.where(replicas < num_ranks, load / replicas, -1.0)
        replicas[int(share.argmax())] += 1
    items = sorted(
        ((float(load[e] / replicas[e]), e) for e in range(num_experts) for _ in range(replicas[e])),
        key=lambda item: (-item[0], item[1]),
    )
    held: list[list[int]] = [[] for _ in range(num_ranks)]
    totals = [0.0] * num_ranks
    for weight, expert in items:
        free = [r for r in range(num_ranks) if len(held[r]) < per_rank]
        fresh = [r for r in free if expert not in held[r]] or free
        rank = min(fresh, key=lambda r: (totals[r], r))
        held[rank].append(expert)
        totals[rank] += weight
    return torch.tensor([e for rank_experts in held for e in sorted(rank_experts)])


def imbalance(slot_load: torch.Tensor, num_ranks: int) -> float:
    """The most tokens a rank's slots got over the mean per rank (1.0: balanced; 1.0 too
    when nothing was routed)."""
    per_rank = slot_load.double().view(num_ranks, -1).sum(dim=1)
    mean = float(per_rank.mean())
    return float(per_rank.max()) / mean if mean > 0 else 1.0


class EplbState:
    """The load windows of a model's mixture-of-experts layers and their rearrangement.

    Each layer exposes `placement` (an ExpertPlacement), `pending_load` ([P] tokens per
    slot routed since the last step, which the layer adds to) and `move_experts(new,
    group)`. The model runner calls `step()` after every forward of a scheduled step and
    `discard()` after a dummy forward (its tokens are not traffic).
    """

    def __init__(self, layers: Sequence[nn.Module], config: EPLBConfig, group: GroupCoordinator):
        """Give each layer its redundant slots (replicas of its first experts, until the
        first rearrangement) and start counting."""
        self.layers = list(layers)
        self.config = config
        self.group = group
        num_slots = 0
        for layer in self.layers:
            placement = layer.placement
            num_slots = placement.num_experts + config.num_redundant_experts
            initial = ExpertPlacement.initial(
                placement.num_experts, num_slots, placement.ep_rank, placement.ep_size
            )
            layer.move_experts(initial.physical_to_logical, group)
            layer.pending_load = torch.zeros(num_slots)
        self.windows = torch.zeros(len(self.layers), config.window_size, num_slots)
        # The windows summed over their steps, kept current (the gauge reads it each step).
        self.sums = torch.zeros(len(self.layers), num_slots)
        self.num_steps = 0  # forward steps since the last rearrangement
        # The imbalance of the window each rearrangement so far balanced, in order.
        self.history: list[float] = []

    def step(self) -> None:
        """Close a forward step: its loads into the window; rearrange when it is time."""
        row = self.num_steps % self.config.window_size
        if self.layers:
            pending = torch.stack([layer.pending_load for layer in self.layers])
            loads = self.group.all_reduce(pending)
            self.sums += loads - self.windows[:, row]
            self.windows[:, row] = loads
        for layer in self.layers:
            layer.pending_load.zero_()
        self.num_steps += 1
        if self.num_steps >= self.config.step_interval:
            self.rearrange()

    def discard(self) -> None:
        for layer in self.layers:
            layer.pending_load.zero_()

    def imbalance(self) -> float:
        """The measured imbalance of the current window, averaged over the layers."""
        if not self.layers:
            return 1.0
        ranks = self.group.world_size
        return sum(imbalance(load, ranks) for load in self.sums) / len(self.layers)

    def rearrange(self) -> None:
        """Place every layer's experts by its window's load; start a new window."""
        before = self.imbalance()
        self.history.append(before)
        for index, layer in enumerate(self.layers):
            placement = layer.placement
            slot_load = self.sums[index]
            logical = torch.zeros(placement.num_experts, dtype=torch.float64)
            logical.index_add_(0, placement.physical_to_logical, slot_load.double())
            new = rebalance_experts(logical, placement.num_slots, self.group.world_size)
            new = self.group.broadcast(new, src=0)  # one placement on every rank
            layer.move_experts(new, self.group)
        self.windows.zero_()
        self.sums.zero_()
        self.num_steps = 0
        if self.config.log_balancedness and self.group.rank_in_group == 0:
            logger.info("EPLB: experts rearranged; the window's imbalance was %.3f", before)
