"""The mixture-of-experts MLP of a decoder layer: a router and stacked experts.

The router (`gate`, a plain linear layer) scores each token against every expert; the
token goes to its `top_k` experts, weighted by their softmax probabilities (renormalized
to sum to 1 where the architecture says so), and `core::fused_moe` runs those experts'
gated MLPs and sums them. The experts' weights are stacked: `experts.w13_weight`
[E, 2 * I, H] (each expert's gate then up projection) and `experts.w2_weight` [E, H, I].
Checkpoints name each expert's projections separately; `ExpertParam` tables map those
names onto the stacked parameters (core.models.hf_weights).

Tensor parallelism splits every expert's intermediate size I, as the dense MLP's: w13
column-parallel, w2 row-parallel, the partial outputs summed across ranks. Under
--enable-expert-parallel each rank of the expert-parallel group holds a share of the
experts whole instead (core.distributed.eplb.ExpertPlacement). How tokens reach them
depends on whether the group's ranks hold the same tokens:

- One engine's tensor-parallel ranks do: each runs its own experts over every token (the
  choices of other ranks' experts routed nowhere, -1) and the sum across ranks adds
  every rank's experts, as under tensor parallelism.
- Several data-parallel engines' ranks do not: each rank dispatches its share of its
  engine's tokens (a slice per tensor-parallel rank) to the ranks that hold their
  experts, all-to-all; each runs its experts over the rows it received and sends the
  outputs back, all-to-all; the owner weights and sums them, and the engine's
  tensor-parallel ranks gather their slices.

Under EPLB each rank counts the routing of its share of its engine's tokens (the same
slices), and the counts are summed over the group (core.distributed.eplb).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.distributed.eplb import ExpertPlacement
from core.distributed.parallel_state import (
    GroupCoordinator,
    get_ep_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
)
from core.models.arch_config import MoEConfig
from core.models.layers.linear import ReplicatedLinear
from core.ops import fused_moe
from core.quantization.weight_loader import ShardId, set_weight_loader


def select_experts(
    router_logits: torch.Tensor,  # [T, E]
    top_k: int,
    renormalize: bool,
    groups: tuple[int, int] = (1, 1),
    scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, top_k] float32 weights, [T, top_k] ids)
    """Each token's `top_k` experts by softmax probability (computed in float32, as
    transformers does), and their probabilities, renormalized over the chosen ones when
    `renormalize`, then times `scaling_factor`.

    `groups` (n_group, topk_group) limits the choice (DeepSeek's group-limited greedy):
    the E experts form n_group consecutive groups, each scored by its best expert, and
    only the topk_group best groups' experts can be chosen; (1, 1) is no limit.
    """
    probs = torch.softmax(router_logits.float(), dim=-1)
    n_group, topk_group = groups
    if topk_group < n_group:
        probs = _keep_top_groups(probs, n_group, topk_group)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * scaling_factor, ids


def _keep_top_groups(
    probs: torch.Tensor,  # [T, E]
    n_group: int,
    topk_group: int,
) -> torch.Tensor:  # [T, E]: zero outside each token's topk_group best groups
    grouped = probs.view(probs.shape[0], n_group, -1)  # [T, G, E / G]
    best = torch.topk(grouped.amax(dim=-1), topk_group, dim=-1).indices  # [T, topk_group]
    keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best, True)
    return grouped.masked_fill(~keep[..., None], 0.0).view_as(probs)


class StackedExperts(nn.Module):
    """This rank's experts: w13_weight [L, 2 * I', H] and w2_weight [L, H, I'] for its L
    slots (core.distributed.eplb.ExpertPlacement: all E experts, or its share of them
    under expert parallelism), I' its share of I (all of it under expert parallelism).
    Their loader takes one expert's checkpoint projection with shard id (expert, 0 gate /
    1 up) for w13 and (expert, 0) for w2, or every expert's stacked (shard None), and
    fills the slots that hold that expert (none: another rank's)."""

    def __init__(
        self, num_experts: int, intermediate_size: int, hidden_size: int, dtype: torch.dtype
    ) -> None:
        super().__init__()
        ep = get_ep_group()
        # The TP ranks that split each expert: all of them, or (experts shared whole) one.
        self.num_splits = 1 if ep.world_size > 1 else get_tensor_model_parallel_world_size()
        self.split_rank = get_tensor_model_parallel_rank() % self.num_splits
        self.intermediate = intermediate_size // self.num_splits  # this rank's share of I
        self.placement = ExpertPlacement.initial(
            num_experts, num_experts, ep.rank_in_group, ep.world_size
        )
        local = self.placement.num_local
        self.w13_weight = nn.Parameter(
            torch.empty(local, 2 * self.intermediate, hidden_size, dtype=dtype),
            requires_grad=False,
        )
        self.w2_weight = nn.Parameter(
            torch.empty(local, hidden_size, self.intermediate, dtype=dtype), requires_grad=False
        )
        for param, loader in ((self.w13_weight, self._load_w13), (self.w2_weight, self._load_w2)):
            set_weight_loader(param, loader)
            param.expert_ids = sorted(set(self.placement.local_experts()))  # its names

    def _slots(self, expert: int) -> list[int]:
        return [j for j, e in enumerate(self.placement.local_experts()) if e == expert]

    def _load_w13(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId) -> None:
        if shard_id is None:  # every expert's [gate | up], stacked
            for slot, expert in enumerate(self.placement.local_experts()):
                gate, up = loaded[expert].chunk(2, dim=0)
                _copy(param.data[slot], torch.cat([self._mine(gate, 0), self._mine(up, 0)]))
            return
        expert, projection = _expert_shard(shard_id, self.placement.num_experts, (0, 1))
        for slot in self._slots(expert):
            rows = param.data[slot].narrow(0, projection * self.intermediate, self.intermediate)
            _copy(rows, self._mine(loaded, 0))

    def _load_w2(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId) -> None:
        if shard_id is None:  # every expert's down projection, stacked
            for slot, expert in enumerate(self.placement.local_experts()):
                _copy(param.data[slot], self._mine(loaded[expert], 1))
            return
        expert, _ = _expert_shard(shard_id, self.placement.num_experts, (0,))
        for slot in self._slots(expert):
            _copy(param.data[slot], self._mine(loaded, 1))

    def _mine(self, loaded: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's share of the intermediate dimension `dim` of `loaded`."""
        whole = self.intermediate * self.num_splits
        if loaded.dim() <= dim or loaded.shape[dim] != whole:
            raise ValueError(f"shape {tuple(loaded.shape)} has no intermediate size {whole} "
                             f"in dimension {dim}")  # fmt: skip
        return loaded.narrow(dim, self.split_rank * self.intermediate, self.intermediate)

    def place(self, physical_to_logical: torch.Tensor, group: GroupCoordinator) -> None:
        """Hold the experts `physical_to_logical` gives this rank's slots (their number may
        change): every rank's slots are gathered, each new slot copies its expert from
        the first old slot that held it. The same placement again moves nothing."""
        old = self.placement.physical_to_logical
        if torch.equal(physical_to_logical.long(), old):
            return
        first_slot = {int(e): int((old == e).nonzero()[0]) for e in old.unique()}
        self.placement.set(physical_to_logical)
        sources = torch.tensor([first_slot[e] for e in self.placement.local_experts()])
        for param in (self.w13_weight, self.w2_weight):
            param.data = group.all_gather(param.data, dim=0).index_select(0, sources)


def _expert_shard(
    shard_id: ShardId, num_experts: int, projections: tuple[int, ...]
) -> tuple[int, int]:
    if not (
        isinstance(shard_id, tuple)
        and 0 <= shard_id[0] < num_experts
        and shard_id[1] in projections
    ):
        raise ValueError(f"expected an (expert < {num_experts}, projection in {projections}) "
                         f"shard, got {shard_id!r}")  # fmt: skip
    return shard_id


def _copy(target: torch.Tensor, loaded: torch.Tensor) -> None:
    if target.shape != loaded.shape:
        raise ValueError(f"shape {tuple(loaded.shape)} does not fit {tuple(target.shape)}")
    target.copy_(loaded)


class FusedMoE(nn.Module):
    """Router `gate` and `experts`, and optionally a `shared_expert` every token goes
    through, scaled by a sigmoid gate of its own (`shared_expert_gate`, Qwen2-MoE):
    [T, H] -> [T, H], summed across tensor-parallel ranks."""

    def __init__(
        self,
        moe: MoEConfig,
        hidden_size: int,
        renormalize: bool,
        prefix: str,
        dtype: torch.dtype,
        shared_expert: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.top_k = moe.top_k
        self.renormalize = renormalize
        self.expert_groups = (moe.n_group, moe.topk_group)
        self.routed_scaling_factor = moe.routed_scaling_factor
        self.tp_size = get_tensor_model_parallel_world_size()
        # The router stays unquantized, as in the checkpoints that quantize the experts.
        self.gate = ReplicatedLinear(
            hidden_size, moe.num_experts, False, None, f"{prefix}.gate", dtype
        )
        self.experts = StackedExperts(moe.num_experts, moe.intermediate_size, hidden_size, dtype)
        # The expert-parallel ranks hold different tokens (experts span engines).
        self.exchanges_tokens = get_ep_group().world_size > self.tp_size
        self.shared_expert = shared_expert
        # Tokens routed to each slot since the last forward step; set by EPLB (None: off).
        self.pending_load: torch.Tensor | None = None
        self.shared_expert_gate = (
            None
            if shared_expert is None
            else ReplicatedLinear(
                hidden_size, 1, False, None, f"{prefix}.shared_expert_gate", dtype
            )
        )

    @property
    def placement(self) -> ExpertPlacement:
        return self.experts.placement

    def move_experts(self, physical_to_logical: torch.Tensor, group: GroupCoordinator) -> None:
        """Take a new placement of the experts (core.distributed.eplb), weights included."""
        self.experts.place(physical_to_logical, group)
        if self.pending_load is not None:
            self.pending_load = torch.zeros(self.placement.num_slots)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        weights, ids = select_experts(
            self.gate(x), self.top_k, self.renormalize, self.expert_groups,
            self.routed_scaling_factor,
        )  # fmt: skip
        if self.exchanges_tokens:
            out = self._exchanged(x, weights, ids)
        else:
            out = self._in_place(x, weights, ids)
        if self.shared_expert is not None:
            # The shared expert's down projection sums its own partial outputs.
            out = out + F.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

    def _in_place(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Every token through this rank's experts (or slices of them), summed over TP."""
        physical = ids
        if not self.placement.is_identity:  # replicas, or experts on other ranks
            physical, ids = self.placement.route(ids)
        self._count(physical[_share(x.shape[0])])
        out = fused_moe(x, self.experts.w13_weight, self.experts.w2_weight, weights, ids)
        if self.tp_size > 1:
            out = get_tp_group().all_reduce(out)
        return out

    def _exchanged(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the tokens to their experts' ranks and back (all-to-all),
        weighted and summed; the slices of the engine's TP ranks gathered."""
        share = _share(x.shape[0])
        physical, _ = self.placement.route(ids[share])
        self._count(physical)
        mine = exchange_with_experts(
            x[share], weights[share], physical, self.experts, get_ep_group()
        )
        if self.tp_size == 1:
            return mine
        padded = F.pad(mine, (0, 0, 0, _slice_rows(x.shape[0]) - mine.shape[0]))
        return get_tp_group().all_gather(padded, dim=0)[: x.shape[0]]

    def _count(self, physical: torch.Tensor) -> None:
        """EPLB: add this rank's share of the routed tokens to each slot's load."""
        if self.pending_load is not None:
            flat = physical.flatten()
            self.pending_load.index_add_(0, flat, torch.ones_like(flat, dtype=torch.float32))


def _slice_rows(num_tokens: int) -> int:
    """The tokens of each tensor-parallel rank's share (the last one's may be fewer)."""
    return -(-num_tokens // get_tensor_model_parallel_world_size())


def _share(num_tokens: int) -> slice:
    """This tensor-parallel rank's slice of its engine's `num_tokens` tokens."""
    rows = _slice_rows(num_tokens)
    start = min(get_tensor_model_parallel_rank() * rows, num_tokens)
    return slice(start, min(start + rows, num_tokens))


def exchange_with_experts(
    x: torch.Tensor,  # [T, H]: this rank's tokens
    weights: torch.Tensor,  # [T, K]
    physical: torch.Tensor,  # [T, K]: each choice's physical slot
    experts: StackedExperts,
    ep: GroupCoordinator,
) -> torch.Tensor:  # [T, H]
    """Send each (token, choice) row to the rank that holds its slot, run the experts
    over the rows received, return them to their owners, and sum each token's weighted
    rows. Rows travel in slot order, so each token's outputs add up in expert order as
    in `core::fused_moe`."""
    num_local, top_k = experts.placement.num_local, physical.shape[1]
    slots = physical.flatten()
    order = slots.argsort(stable=True)
    slots = slots[order]
    owners = slots // num_local
    send = torch.bincount(owners, minlength=ep.world_size).tolist()
    recv = ep.exchange_counts(send)
    rows = ep.all_to_all(x.index_select(0, order // top_k), send, recv)
    local_slots = ep.all_to_all(slots - owners * num_local, send, recv)
    computed = torch.zeros_like(rows)
    if rows.shape[0]:
        ones = torch.ones(rows.shape[0], 1, dtype=torch.float32, device=rows.device)
        computed = fused_moe(
            rows, experts.w13_weight, experts.w2_weight, ones, local_slots.view(-1, 1)
        )
    back = ep.all_to_all(computed, recv, send)
    pair_weights = weights.flatten()[order].to(x.dtype)
    out = torch.zeros_like(x)
    return out.index_add_(0, order // top_k, back * pair_weights[:, None])
