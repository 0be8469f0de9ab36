"""Loading Hugging Face-named checkpoint tensors into a model's (possibly fused) parameters.

Checkpoints name each projection separately ("...self_attn.q_proj.weight"); the models
fuse some of them into one parameter ("...self_attn.qkv_proj.weight"). A `StackedParam`
table maps one onto the other, and each parameter's `weight_loader` places the shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from core.quantization.weight_loader import ShardId, get_weight_loader


@dataclass(frozen=True)
class StackedParam:
    """The checkpoint module `hf_module` is shard `shard_id` of the model's `fused_module`."""

    fused_module: str  # e.g. "qkv_proj"
    hf_module: str  # e.g. "q_proj"
    shard_id: ShardId


def load_hf_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked: Sequence[StackedParam],
    skip: Callable[[str], bool],
) -> None:
    """Load every `(hf_name, tensor)` into `model`; names for which `skip` is true are ignored.

    Raises ValueError naming the checkpoint tensors that match no parameter and the ones
    the model needs but did not get, or naming the tensor whose shape does not fit. Then
    runs `process_weights_after_loading`.
    """
    params = dict(model.named_parameters())
    seen: set[str] = set()
    unexpected: list[str] = []
    for hf_name, tensor in weights:
        if skip(hf_name):
            continue
        name, shard_id = _param_name(hf_name, stacked)
        if name not in params:
            unexpected.append(hf_name)
            continue
        param = params[name]
        try:
            get_weight_loader(param)(param, tensor, shard_id)
        except ValueError as exc:
            raise ValueError(f"checkpoint weight {hf_name!r}: {exc}") from exc
        seen.add(hf_name)
    missing = _hf_names(params, stacked) - seen
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not fit {type(model).__name__}: "
            f"missing weights {sorted(missing)}, unexpected weights {sorted(unexpected)}"
        )
    process_weights_after_loading(model)


def process_weights_after_loading(model: nn.Module) -> None:
    """Let the LinearMethod of every layer of `model` that has one (linear layers,
    embeddings) turn its loaded tensors into their final form; once, after loading."""
    for module in model.modules():
        method = getattr(module, "linear_method", None)
        if method is not None:
            method.process_weights_after_loading(module)


def _param_name(hf_name: str, stacked: Sequence[StackedParam]) -> tuple[str, ShardId]:
    """(model parameter name, shard id) of the checkpoint tensor `hf_name`."""
    parts = hf_name.split(".")
    for entry in stacked:
        if entry.hf_module in parts:
            parts[parts.index(entry.hf_module)] = entry.fused_module
            return ".".join(parts), entry.shard_id
    return hf_name, None


def _hf_names(params: dict[str, nn.Parameter], stacked: Sequence[StackedParam]) -> set[str]:
    """The checkpoint names that together fill every parameter of `params`."""
    names: set[str] = set()
    for name in params:
        parts = name.split(".")
        shards = [entry for entry in stacked if entry.fused_module in parts]
        if not shards:
            names.add(name)
        for entry in shards:
            index = parts.index(entry.fused_module)
            names.add(".".join([*parts[:index], entry.hf_module, *parts[index + 1 :]]))
    return names
