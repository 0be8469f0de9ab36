"""Which processes talk to which: the rank grid and one group coordinator per parallel axis.

The world's ranks form a grid DP x PP x TP with TP varying fastest, so the ranks of one
tensor-parallel group are neighbours (on one host, where the fast links are):
global rank = (dp * PP + pp) * TP + tp. Each axis group holds two process groups: a gloo
CPU group for metadata and Python objects (a device backend would stage them through
device memory) and a device group of the platform's backend for tensors.

Process-wide state: `init_distributed_environment` joins the world, then
`initialize_model_parallel` builds the TP, PP and DP groups; the getters read them. When
torch.distributed was never initialised the process is a world of one, and the getters
answer single-rank groups whose collectives are the identity.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from core.distributed.communicator import DeviceCommunicator


@dataclass(frozen=True)
class RankGrid:
    """The DP x PP x TP layout of the world's ranks (TP fastest); pure arithmetic."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1

    def __post_init__(self) -> None:
        for flag, size in self._flags():
            if size < 1:
                raise ValueError(f"{flag} must be at least 1, got {size}")

    def _flags(self) -> tuple[tuple[str, int], ...]:
        return (
            ("--tensor-parallel-size", self.tensor_parallel_size),
            ("--pipeline-parallel-size", self.pipeline_parallel_size),
            ("--data-parallel-size", self.data_parallel_size),
        )

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def require_world_size(self, world_size: int) -> None:
        """Raise ValueError naming the flags when the grid does not cover `world_size`."""
        if self.world_size != world_size:
            product = " x ".join(f"{flag} {size}" for flag, size in self._flags())
            raise ValueError(f"{product} = {self.world_size} ranks, but the world has {world_size}")

    def tp_group_ranks(self) -> list[list[int]]:
        """The tensor-parallel groups: consecutive runs of TP ranks."""
        return self._axis_groups(2)

    def pp_group_ranks(self) -> list[list[int]]:
        """The pipeline groups: one per (dp, tp), stages in order."""
        return self._axis_groups(1)

    def dp_group_ranks(self) -> list[list[int]]:
        """The data-parallel groups: one per (pp, tp)."""
        return self._axis_groups(0)

    def ep_group_ranks(self) -> list[list[int]]:
        """The expert-parallel groups when experts span data-parallel engines: one per
        pipeline stage, every (dp, tp) rank of it in global order."""
        grid = torch.arange(self.world_size).reshape(
            self.data_parallel_size, self.pipeline_parallel_size, self.tensor_parallel_size
        )
        return grid.movedim(1, 0).reshape(self.pipeline_parallel_size, -1).tolist()

    def _axis_groups(self, axis: int) -> list[list[int]]:
        # grid: [DP, PP, TP] of global ranks; moving `axis` last makes each row one group.
        sizes = (self.data_parallel_size, self.pipeline_parallel_size, self.tensor_parallel_size)
        grid = torch.arange(self.world_size).reshape(sizes)
        return grid.movedim(axis, -1).reshape(-1, sizes[axis]).tolist()


class _TensorMeta(NamedTuple):
    """What the receiver of `send_tensor_dict` needs to make room for one tensor."""

    dtype: torch.dtype
    shape: torch.Size
    on_device: bool  # False: a CPU tensor while the group's device is not the CPU


class GroupCoordinator:
    """One parallel axis group this process belongs to, and its collectives.

    Contract:
    - `ranks` are the global ranks of the group in group order, `rank` this process's global
      rank, `rank_in_group` its index in `ranks`; `next_rank` / `prev_rank` are the global
      ranks after and before it on the ring of the group.
    - Every rank argument of a collective (`src`, `dst`) is a rank in the group.
    - With one rank every collective is the identity and touches no process group, so
      single-process code runs without torch.distributed.
    - `cpu_group` (gloo) carries metadata and objects; `device_group` (the platform's
      backend) carries tensors, through `communicator`. Both are None only for groups built
      without torch.distributed (single-rank stand-ins and `patch_tensor_parallel`), whose
      collectives raise RuntimeError when the group has more than one rank.
    """

    def __init__(
        self,
        name: str,
        ranks: list[int],
        rank: int,
        cpu_group: ProcessGroup | None = None,
        device_group: ProcessGroup | None = None,
        communicator: DeviceCommunicator | None = None,
    ) -> None:
        if rank not in ranks:
            raise ValueError(f"rank {rank} is not in the {name} group {ranks}")
        self.name = name
        self.ranks = ranks
        self.rank = rank
        self.rank_in_group = ranks.index(rank)
        self.world_size = len(ranks)
        self.cpu_group = cpu_group
        self.device_group = device_group
        self.communicator = communicator

    @classmethod
    def connect(
        cls,
        name: str,
        group_ranks: list[list[int]],
        rank: int,
        backend: str,
        communicator_cls: type[DeviceCommunicator],
        device: torch.device,
    ) -> GroupCoordinator:
        """The group of `group_ranks` (all groups of one axis) that holds `rank`.

        Every process calls this with the same `group_ranks`: torch.distributed.new_group is
        collective over the whole world, even for the groups a process is not in, and the
        groups pair up by creation order.
        """
        mine: tuple[list[int], ProcessGroup, ProcessGroup] | None = None
        for ranks in group_ranks:
            cpu_group = dist.new_group(ranks, backend="gloo")
            # A second gloo group would be the same transport twice.
            if backend == "gloo":
                device_group = cpu_group
            else:
                device_group = dist.new_group(ranks, backend=backend)
            if rank in ranks:
                mine = (ranks, cpu_group, device_group)
        if mine is None:
            raise ValueError(f"rank {rank} is in none of the {name} groups {group_ranks}")
        ranks, cpu_group, device_group = mine
        communicator = communicator_cls(device_group, ranks, ranks.index(rank), device)
        return cls(name, ranks, rank, cpu_group, device_group, communicator)

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    @property
    def next_rank(self) -> int:
        return self.ranks[(self.rank_in_group + 1) % self.world_size]

    @property
    def prev_rank(self) -> int:
        return self.ranks[(self.rank_in_group - 1) % self.world_size]

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of `t` over the group (`t` may be overwritten)."""
        return t if self.world_size == 1 else self._communicator().all_reduce(t)

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `t` concatenated along `dim` in group order, on every rank."""
        return t if self.world_size == 1 else self._communicator().all_gather(t, dim)

    def exchange_counts(self, send_counts: list[int]) -> list[int]:
        """What every rank's `send_counts` holds for this one, in group order: the rows an
        `all_to_all` with those counts will bring here."""
        if self.world_size == 1:
            return list(send_counts)
        self._check_counts(send_counts)
        communicator = self._communicator()
        counts = torch.tensor(send_counts, dtype=torch.int64, device=communicator.device)
        ones = [1] * self.world_size
        return communicator.all_to_all(counts, ones, ones).tolist()

    def all_to_all(
        self, t: torch.Tensor, send_counts: list[int], recv_counts: list[int]
    ) -> torch.Tensor:
        """Scatter the rows of `t` over the group (send_counts[r] of them, in order, to
        rank r); the rows the ranks sent this one, in group order (recv_counts[r] from
        rank r: `exchange_counts` tells them)."""
        if self.world_size == 1:
            return t
        self._check_counts(send_counts)
        self._check_counts(recv_counts)
        return self._communicator().all_to_all(t, send_counts, recv_counts)

    def _check_counts(self, counts: list[int]) -> None:
        if len(counts) != self.world_size:
            raise ValueError(f"{len(counts)} row counts for a group of {self.world_size} ranks")

    def gather(self, t: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """Every rank's `t` concatenated along `dim` on rank `dst`; None on the others."""
        if self.world_size == 1:
            return t
        return self._communicator().gather(t, dst, dim)

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank `src`'s `t` on every rank; the others pass a tensor of its shape and dtype."""
        return t if self.world_size == 1 else self._communicator().broadcast(t, src)

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """Rank `src`'s picklable `obj` on every rank (the others' `obj` is ignored)."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, group=self._cpu_group(), group_src=src)
        return box[0]

    def barrier(self) -> None:
        """Return once every rank of the group has called it (over the CPU group: a device
        barrier would allocate on whatever device is current)."""
        if self.world_size > 1:
            dist.barrier(group=self._cpu_group())

    def send_tensor_dict(self, tensor_dict: dict[str, Any], dst: int | None = None) -> None:
        """Send `tensor_dict` (tensors and picklable values) to rank `dst`, default the next.

        This is how a pipeline stage hands its intermediate tensors on: the keys, plain
        values and tensor shapes go as one object over the CPU group, then each non-empty
        tensor on the group's device over the device group and each CPU tensor (when the
        device is not the CPU) over the CPU group. Raises ValueError for a tensor elsewhere.
        """
        dst = self._peer(dst, (self.rank_in_group + 1) % self.world_size)
        device = self._communicator().device
        metadata: list[tuple[str, Any]] = []
        for key, value in tensor_dict.items():
            if isinstance(value, torch.Tensor):
                _check_sendable(key, value, device)
                value = _TensorMeta(value.dtype, value.shape, value.device == device)
            metadata.append((key, value))
        dist.send_object_list([metadata], group=self._cpu_group(), group_dst=dst)
        for value in tensor_dict.values():
            if isinstance(value, torch.Tensor) and value.numel() > 0:
                self._send_tensor(value, dst, value.device == device)

    def recv_tensor_dict(self, src: int | None = None) -> dict[str, Any]:
        """The dict rank `src` (default the previous) sent with `send_tensor_dict`, in its
        key order; tensors land on the group's device, or the CPU when they left from it."""
        src = self._peer(src, (self.rank_in_group - 1) % self.world_size)
        box: list[Any] = [None]
        dist.recv_object_list(box, group=self._cpu_group(), group_src=src)
        received = {}
        for key, value in box[0]:
            if isinstance(value, _TensorMeta):
                value = self._recv_tensor(value, src)
            received[key] = value
        return received

    def destroy(self) -> None:
        """Release the communicator, then the process groups (the first may use them)."""
        if self.communicator is not None:
            self.communicator.destroy()
        if self.device_group is not None and self.device_group is not self.cpu_group:
            dist.destroy_process_group(self.device_group)
        if self.cpu_group is not None:
            dist.destroy_process_group(self.cpu_group)
        self.communicator = self.device_group = self.cpu_group = None

    def _send_tensor(self, t: torch.Tensor, dst: int, on_device: bool) -> None:
        if on_device:
            self._communicator().send(t, dst)
        else:
            dist.send(t.contiguous(), group=self._cpu_group(), group_dst=dst)

    def _recv_tensor(self, meta: _TensorMeta, src: int) -> torch.Tensor:
        if meta.on_device:
            communicator = self._communicator()
            if meta.shape.numel() == 0:
                return torch.empty(meta.shape, dtype=meta.dtype, device=communicator.device)
            return communicator.recv(meta.shape, meta.dtype, src)
        t = torch.empty(meta.shape, dtype=meta.dtype)
        if t.numel() > 0:
            dist.recv(t, group=self._cpu_group(), group_src=src)
        return t

    def _peer(self, peer: int | None, default: int) -> int:
        peer = default if peer is None else peer
        if peer == self.rank_in_group:
            raise RuntimeError(
                f"rank {self.rank} of the {self.name} group {self.ranks} cannot send to or "
                "receive from itself"
            )
        return peer

    def _communicator(self) -> DeviceCommunicator:
        if self.communicator is None:
            raise self._unconnected()
        return self.communicator

    def _cpu_group(self) -> ProcessGroup:
        if self.cpu_group is None:
            raise self._unconnected()
        return self.cpu_group

    def _unconnected(self) -> RuntimeError:
        return RuntimeError(
            f"the {self.name} group of {self.world_size} ranks has no process group (a "
            "stand-in such as patch_tensor_parallel's); collectives need "
            "initialize_model_parallel"
        )


def _check_sendable(key: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device and t.device.type != "cpu":
        raise ValueError(f"tensor {key!r} is on {t.device}, neither on {device} nor the CPU")


_WORLD: GroupCoordinator | None = None
_TP: GroupCoordinator | None = None
_EP: GroupCoordinator | None = None  # under expert parallelism: TP, or DP x TP
_PP: GroupCoordinator | None = None
_DP: GroupCoordinator | None = None


def init_distributed_environment(
    world_size: int,
    rank: int,
    distributed_init_method: str,
    local_rank: int = 0,
    backend: str = "gloo",
) -> None:
    """Join the world of `world_size` processes as `rank` and build the world group.

    Initialises torch.distributed (`distributed_init_method` such as tcp://host:port or
    file://path) unless the process already did. Tensors live on the CPU under gloo and on
    cuda:`local_rank` otherwise (torch's nccl backend, RCCL on ROCm, drives "cuda" devices).
    """
    global _WORLD
    if not dist.is_initialized():
        dist.init_process_group(
            backend, init_method=distributed_init_method, world_size=world_size, rank=rank
        )
    if dist.get_world_size() != world_size:
        raise ValueError(
            f"world_size {world_size} differs from the initialised world's {dist.get_world_size()}"
        )
    if _WORLD is None:
        device = torch.device("cpu") if backend == "gloo" else torch.device("cuda", local_rank)
        ranks = [list(range(world_size))]
        _WORLD = GroupCoordinator.connect("world", ranks, rank, backend, DeviceCommunicator, device)


def initialize_model_parallel(
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    data_parallel_size: int = 1,
    backend: str = "gloo",
    communicator_cls: type[DeviceCommunicator] = DeviceCommunicator,
    expert_parallel: bool = False,
) -> None:
    """Build the TP, PP and DP groups of the grid; every process of the world calls it.
    With `expert_parallel` the expert-parallel group (`get_ep_group`) is the TP group, or
    with several data-parallel ranks every (dp, tp) rank of a pipeline stage.

    Raises ValueError naming the flags when the sizes do not multiply to the world size,
    RuntimeError before `init_distributed_environment` or when the groups exist already.
    `communicator_cls` is the platform's `device_communicator_cls`.
    """
    global _TP, _PP, _DP, _EP
    world = _WORLD
    if world is None:
        raise RuntimeError("init_distributed_environment must run before initialize_model_parallel")
    if model_parallel_is_initialized():
        raise RuntimeError("model parallel groups exist already: call destroy_model_parallel first")
    grid = RankGrid(tensor_parallel_size, pipeline_parallel_size, data_parallel_size)
    grid.require_world_size(world.world_size)
    device = world._communicator().device
    # The same order on every process: new_group pairs groups up by creation order.
    axes = (
        ("tp", grid.tp_group_ranks()),
        ("pp", grid.pp_group_ranks()),
        ("dp", grid.dp_group_ranks()),
    )
    if expert_parallel and data_parallel_size > 1:
        axes += (("ep", grid.ep_group_ranks()),)
    groups = [
        GroupCoordinator.connect(name, ranks, world.rank, backend, communicator_cls, device)
        for name, ranks in axes
    ]
    _TP, _PP, _DP = groups[:3]
    _EP = groups[3] if len(groups) > 3 else _TP if expert_parallel else None


def model_parallel_is_initialized() -> bool:
    return _TP is not None and _PP is not None and _DP is not None


def _group(group: GroupCoordinator | None, name: str) -> GroupCoordinator:
    """`group`; else a single-rank stand-in when this process is a world of one."""
    if group is not None:
        return group
    if dist.is_initialized():
        raise RuntimeError(f"the {name} group is not initialised: call initialize_model_parallel")
    return GroupCoordinator(name, [0], 0)


def get_world_group() -> GroupCoordinator:
    return _group(_WORLD, "world")


def get_tp_group() -> GroupCoordinator:
    return _group(_TP, "tp")


def get_pp_group() -> GroupCoordinator:
    return _group(_PP, "pp")


def get_dp_group() -> GroupCoordinator:
    return _group(_DP, "dp")


def get_ep_group() -> GroupCoordinator:
    """The ranks that share a mixture of experts' experts, each holding a share of them
    whole, under --enable-expert-parallel: the TP group, or every engine's ranks with
    several data-parallel engines; otherwise a group of one (each TP rank holds a slice
    of every expert instead)."""
    return _EP if _EP is not None else GroupCoordinator("ep", [0], 0)


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_pipeline_model_parallel_rank() -> int:
    return get_pp_group().rank_in_group


def get_pipeline_model_parallel_world_size() -> int:
    return get_pp_group().world_size


def destroy_model_parallel() -> None:
    """Release the TP, PP, DP and EP groups (a no-op for those never built)."""
    global _TP, _PP, _DP, _EP
    for group in (_TP, _PP, _DP, None if _EP is _TP else _EP):
        if group is not None:
            group.destroy()
    _TP = _PP = _DP = _EP = None


def destroy_distributed_environment() -> None:
    """Release every group, the world group last, and leave torch.distributed."""
    global _WORLD
    destroy_model_parallel()
    if _WORLD is not None:
        _WORLD.destroy()
        _WORLD = None
    if dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def patch_tensor_parallel(rank: int, world_size: int) -> Iterator[GroupCoordinator]:
    """Make the TP getters answer `rank` of `world_size` without any process group.

    For layer tests in one process: the yielded stand-in's collectives raise RuntimeError
    when `world_size` > 1. The previous TP group comes back on exit.
    """
    global _TP
    saved = _TP
    _TP = GroupCoordinator("tp", list(range(world_size)), rank)
    try:
        yield _TP
    finally:
        _TP = saved
