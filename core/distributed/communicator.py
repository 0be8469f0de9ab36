"""The tensor collectives of one process group, the part of a group a platform may replace.

A platform names its class in `Platform.device_communicator_cls` (a GPU plugin's custom
all-reduce, say); this one is the reference, plain torch.distributed over the group's device
process group, and serves gloo (CPU) and nccl (CUDA, RCCL on ROCm) alike.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup


class DeviceCommunicator:
    """Collectives over `device_group`, the device process group of the ranks `ranks`.

    Contract:
    - Built once per group as `cls(device_group, ranks, rank_in_group, device)`: `ranks` are
      the global ranks of the group in group order, `rank_in_group` this process's index in
      them, `device` where this rank's tensors live (received tensors are made there).
    - Every rank argument (`dst`, `src`) is a rank in the group, not a global rank.
    - Each collective is called by every rank of the group in the same order (send / recv:
      by the two ranks named); a rank that skips one leaves the others blocked.
    - Tensors passed in are on `device`; `all_reduce` and `broadcast` may work in place on
      them (this reference does), so callers pass tensors they own.
    - The group coordinator never calls a collective when the group has one rank.
    """

    def __init__(
        self,
        device_group: ProcessGroup,
        ranks: list[int],
        rank_in_group: int,
        device: torch.device,
    ) -> None:
        self.device_group = device_group
        self.ranks = ranks
        self.rank_in_group = rank_in_group
        self.world_size = len(ranks)
        self.device = device

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of `t` over the group (in place on `t` here)."""
        dist.all_reduce(t, group=self.device_group)
        return t

    def all_gather(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's `t` concatenated along `dim`, in group order; same on every rank.

        All ranks pass tensors of one shape, with at least one dimension.
        """
        # gathered: [world_size * t.shape[0], *t.shape[1:]], the layout every backend
        # accepts (gloo takes no stacked [world_size, *t.shape]); one collective.
        shape = (self.world_size * t.shape[0], *t.shape[1:])
        gathered = torch.empty(shape, dtype=t.dtype, device=t.device)
        dist.all_gather_single(gathered, t.contiguous(), group=self.device_group)
        return torch.cat(gathered.chunk(self.world_size), dim=dim)

    def gather(self, t: torch.Tensor, dst: int, dim: int) -> torch.Tensor | None:
        """Every rank's `t` concatenated along `dim` on rank `dst`; None on the others."""
        is_dst = self.rank_in_group == dst
        parts = [torch.empty_like(t) for _ in self.ranks] if is_dst else None
        dist.gather(t.contiguous(), parts, group=self.device_group, group_dst=dst)
        return torch.cat(parts, dim=dim) if parts is not None else None

    def all_to_all(
        self, t: torch.Tensor, send_counts: list[int], recv_counts: list[int]
    ) -> torch.Tensor:
        """Rows of `t` to every rank, in group order: the first send_counts[0] to rank 0,
        the next send_counts[1] to rank 1, ...; the rows every rank sent this one, in
        group order (recv_counts[r] from rank r, as rank r's send_counts said)."""
        out = torch.empty((sum(recv_counts), *t.shape[1:]), dtype=t.dtype, device=t.device)
        dist.all_to_all_single(
            out, t.contiguous(), recv_counts, send_counts, group=self.device_group
        )
        return out

    def broadcast(self, t: torch.Tensor, src: int) -> torch.Tensor:
        """Rank `src`'s `t` on every rank (written into `t` in place here).

        Non-source ranks pass a tensor of the source's shape and dtype.
        """
        dist.broadcast(t, group=self.device_group, group_src=src)
        return t

    def send(self, t: torch.Tensor, dst: int) -> None:
        """Send `t` to rank `dst`, which receives it with `recv` of the same shape and dtype."""
        dist.send(t.contiguous(), group=self.device_group, group_dst=dst)

    def recv(
        self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype, src: int
    ) -> torch.Tensor:
        """A tensor of `shape` and `dtype` on `device`, filled by rank `src`'s `send`."""
        t = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(t, group=self.device_group, group_src=src)
        return t

    def destroy(self) -> None:
        """Release what this communicator built over the group, before the group goes.

        The reference builds nothing; a replacement holding workspaces frees them here.
        """
