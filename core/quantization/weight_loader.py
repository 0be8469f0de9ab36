"""Per-parameter weight loaders: how one checkpoint tensor lands in one model parameter.

Every parameter a model loads may carry a `weight_loader(param, loaded, shard_id)`
attribute; the model's `load_weights` calls it with the Hugging Face tensor and, for a
fused parameter (q/k/v or gate/up stacked along the output dimension), the id of the
shard the tensor fills. Parameters without one get `default_weight_loader`. Quantization
plugins build their parameters' loaders from the helpers here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

ShardId = int | str | tuple[int, int] | None
"""Which fused output a checkpoint tensor fills: an index, a layer's own name ("q"), an
(expert, projection) pair of a fused MoE layer's stacked experts, or None."""


class WeightLoader(Protocol):
    def __call__(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None: ...


def set_weight_loader(param: nn.Parameter, loader: WeightLoader) -> None:
    param.weight_loader = loader


def add_parameter(
    layer: nn.Module, name: str, shape: Sequence[int], dtype: torch.dtype, loader: WeightLoader
) -> nn.Parameter:
    """Register an uninitialised inference parameter `name` on `layer` that `loader` fills.

    What every LinearMethod.create_weights does per tensor: requires_grad=False, the
    current default device, and the loader the model's load_weights will call.
    """
    param = nn.Parameter(torch.empty(tuple(shape), dtype=dtype), requires_grad=False)
    set_weight_loader(param, loader)
    layer.register_parameter(name, param)
    return param


@dataclass(frozen=True)
class ShardDims:
    """Which dimensions of a checkpoint tensor run along W's outputs and inputs (None: the
    tensor does not extend along that axis, e.g. a bias's input), and how many of W's
    outputs / inputs one element along each covers (8 for eight 4-bit values packed per
    int32, the group size for per-group scales)."""

    output_dim: int | None
    input_dim: int | None
    output_unit: int = 1
    input_unit: int = 1


def set_shard_dims(
    param: nn.Parameter,
    output_dim: int | None,
    input_dim: int | None,
    output_unit: int = 1,
    input_unit: int = 1,
) -> None:
    """Say how the checkpoint tensors `param`'s loader takes lie along W (ShardDims), so
    that a tensor-parallel layer can hand the loader its rank's slice. A parameter without
    them cannot be sharded: tensor parallelism refuses its layer."""
    param.shard_dims = ShardDims(output_dim, input_dim, output_unit, input_unit)


def get_shard_dims(param: nn.Parameter) -> ShardDims | None:
    return getattr(param, "shard_dims", None)


RandomValues = Callable[[torch.Generator], torch.Tensor]


def set_random_values(param: nn.Parameter, make: RandomValues) -> None:
    """Say how to make a random checkpoint tensor for `param`, for tests and the
    conformance kit, when not every bit pattern of its dtype is a valid one (block scales
    that must be finite, type tags). `make(generator)` returns what the parameter's
    weight_loader takes for the whole of a single-output layer's parameter."""
    param.random_values = make


def get_random_values(param: nn.Parameter) -> RandomValues | None:
    """The parameter's own maker of random checkpoint tensors, if it has one."""
    return getattr(param, "random_values", None)


def get_weight_loader(param: nn.Parameter) -> WeightLoader:
    """The parameter's own loader, else `default_weight_loader`."""
    return getattr(param, "weight_loader", default_weight_loader)


def default_weight_loader(
    param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None
) -> None:
    """Copy `loaded` into the whole of `param` (cast to its dtype); shapes must match."""
    if shard_id is not None:
        raise ValueError(f"parameter is not fused, got shard {shard_id!r}")
    _copy_checked(param.data, loaded)


def fused_weight_loader(output_sizes: Sequence[int], output_dim: int = 0) -> WeightLoader:
    """A loader for a parameter holding `len(output_sizes)` shards along `output_dim`.

    Shard ids are indices into `output_sizes`; shard i fills the slice starting at
    sum(output_sizes[:i]). A parameter not split per shard (one shard) takes shard None.
    A plugin whose parameters pack several outputs per element (e.g. eight 4-bit values
    per int32) passes the packed sizes.
    """
    offsets = [sum(output_sizes[:i]) for i in range(len(output_sizes))]

    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: int | None = None) -> None:
        if shard_id is None:
            if len(output_sizes) != 1:
                raise ValueError(f"fused parameter of {len(output_sizes)} shards needs a shard id")
            shard_id = 0
        if not 0 <= shard_id < len(output_sizes):
            raise ValueError(f"shard {shard_id} out of range for {len(output_sizes)} shards")
        target = param.data.narrow(output_dim, offsets[shard_id], output_sizes[shard_id])
        _copy_checked(target, loaded)

    return load


def _copy_checked(target: torch.Tensor, loaded: torch.Tensor) -> None:
    if target.shape != loaded.shape:
        raise ValueError(f"shape {tuple(loaded.shape)} does not fit {tuple(target.shape)}")
    target.copy_(loaded)
