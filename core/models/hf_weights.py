"""Loading Hugging Face-named checkpoint tensors into a model's (possibly fused) parameters.

Checkpoints name each projection separately ("...self_attn.q_proj.weight"); the models
fuse some of them into one parameter ("...self_attn.qkv_proj.weight"). A `StackedParam`
table maps one onto the other, and each parameter's `weight_loader` places the shard.
Mixture-of-experts checkpoints name every expert's projections too
("...mlp.experts.3.gate_proj.weight"); an `ExpertParam` table maps those onto the
experts' stacked parameters ("...mlp.experts.w13_weight", shard (3, 0)). transformers 5
keeps experts stacked in memory ("...mlp.experts.gate_up_proj" [E, 2 * I, H],
"...mlp.experts.down_proj" [E, H, I]): those load whole (shard None).
Checkpoints that fuse projections themselves (Phi-3's "...self_attn.qkv_proj.weight") are
split back into the separate names first (`split_fused_weights`), so one table serves both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from core.attention.layer import load_kv_scale
from core.quantization.weight_loader import ShardId, get_weight_loader


@dataclass(frozen=True)
class StackedParam:
    """The checkpoint module `hf_module` is shard `shard_id` of the model's `fused_module`."""

    fused_module: str  # e.g. "qkv_proj"
    hf_module: str  # e.g. "q_proj"
    shard_id: ShardId


# transformers 5's stacked expert tensors -> the model's stacked parameters.
_STACKED_EXPERTS = {"gate_up_proj": "w13_weight", "down_proj": "w2_weight"}


@dataclass(frozen=True)
class ExpertParam:
    """Checkpoint tensors "{...}.experts.{e}.{hf_module}.weight" are shard (e, `shard`) of
    the model's stacked "{...}.experts.{stacked_param}"."""

    stacked_param: str  # e.g. "w13_weight"
    hf_module: str  # e.g. "gate_proj" (Mixtral: "w1")
    shard: int  # the projection within the stacked parameter: gate 0, up 1


@dataclass(frozen=True)
class FusedCheckpointModule:
    """The checkpoint stores the projections `parts` (name, output size) one after another
    along the output dimension of one module `hf_module` (Phi-3's "qkv_proj" holds q_proj,
    k_proj and v_proj)."""

    hf_module: str  # e.g. "qkv_proj"
    parts: tuple[tuple[str, int], ...]  # e.g. (("q_proj", 3072), ("k_proj", 1024), ...)


def load_hf_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked: Sequence[StackedParam],
    skip: Callable[[str], bool],
    experts: Sequence[ExpertParam] = (),
) -> None:
    """Load every `(hf_name, tensor)` into `model`; names for which `skip` is true are ignored.
    A KV-cache scale ("...self_attn.k_scale") goes to its Attention layer (`load_kv_scale`),
    which keeps its default when the checkpoint has none.

    Raises ValueError naming the checkpoint tensors that match no parameter and the ones
    the model needs but did not get, or naming the tensor whose shape does not fit. Then
    runs `process_weights_after_loading`.
    """
    params = dict(model.named_parameters())
    seen: set[str] = set()
    unexpected: list[str] = []
    for hf_name, tensor in weights:
        if skip(hf_name) or load_kv_scale(model, hf_name, tensor):
            continue
        name, shard_id = _expert_param_name(hf_name, experts) or _param_name(hf_name, stacked)
        if name not in params:
            unexpected.append(hf_name)
            continue
        param = params[name]
        try:
            get_weight_loader(param)(param, tensor, shard_id)
        except ValueError as exc:
            raise ValueError(f"checkpoint weight {hf_name!r}: {exc}") from exc
        seen.add(hf_name)
        if name.endswith(tuple(_STACKED_EXPERTS.values())) and shard_id is None:
            seen |= _expert_names(name, param, experts)  # every expert at once
    missing = _hf_names(params, stacked, experts) - seen
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


def split_fused_weights(
    weights: Iterable[tuple[str, torch.Tensor]], fused: Sequence[FusedCheckpointModule]
) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` with each fused module's tensors split into its parts' (views), named as a
    checkpoint of separate projections names them ("...self_attn.q_proj.weight"), so that
    the model's StackedParam table loads them, each rank cutting its share as usual.

    Only unquantized tensors split (weights and biases, outputs along dimension 0): a
    fused module's other tensors (packed quantized weights, scales) raise ValueError, as
    does a tensor whose outputs are not the parts' sizes.
    """
    by_module = {entry.hf_module: entry for entry in fused}
    for hf_name, tensor in weights:
        parts = hf_name.split(".")
        entry = by_module.get(parts[-2]) if len(parts) > 1 else None
        if entry is None:
            yield hf_name, tensor
            continue
        if parts[-1] not in ("weight", "bias"):
            raise ValueError(
                f"checkpoint weight {hf_name!r}: only unquantized fused projections "
                f"({entry.hf_module}.weight / .bias) can be split"
            )
        sizes = [size for _, size in entry.parts]
        if tensor.shape[0] != sum(sizes):
            raise ValueError(
                f"checkpoint weight {hf_name!r}: {tensor.shape[0]} outputs, expected "
                f"{sum(sizes)} ({' + '.join(f'{name} {size}' for name, size in entry.parts)})"
            )
        for (name, _), piece in zip(entry.parts, tensor.split(sizes), strict=True):
            yield ".".join([*parts[:-2], name, parts[-1]]), piece


def _param_name(hf_name: str, stacked: Sequence[StackedParam]) -> tuple[str, ShardId]:
    """(model parameter name, shard id) of the checkpoint tensor `hf_name`."""
    parts = hf_name.split(".")
    for entry in stacked:
        if entry.hf_module in parts:
            parts[parts.index(entry.hf_module)] = entry.fused_module
            return ".".join(parts), entry.shard_id
    return hf_name, None


def _expert_param_name(hf_name: str, experts: Sequence[ExpertParam]) -> tuple[str, ShardId] | None:
    """(stacked parameter name, (expert, shard)) of an expert's checkpoint tensor; None
    for any other tensor."""
    parts = hf_name.split(".")
    if experts and parts[-2:-1] == ["experts"] and parts[-1] in _STACKED_EXPERTS:
        return ".".join([*parts[:-1], _STACKED_EXPERTS[parts[-1]]]), None
    for i in range(len(parts) - 3):
        if parts[i] != "experts" or not parts[i + 1].isdigit() or parts[i + 3] != "weight":
            continue
        for entry in experts:
            if entry.hf_module == parts[i + 2]:
                return ".".join([*parts[: i + 1], entry.stacked_param]), (
                    int(parts[i + 1]),
                    entry.shard,
                )
    return None


def _hf_names(
    params: dict[str, nn.Parameter],
    stacked: Sequence[StackedParam],
    experts: Sequence[ExpertParam],
) -> set[str]:
    """The checkpoint names that together fill every parameter of `params`."""
    names: set[str] = set()
    for name, param in params.items():
        expert_names = _expert_names(name, param, experts)
        if expert_names:
            names |= expert_names
            continue
        parts = name.split(".")
        shards = [entry for entry in stacked if entry.fused_module in parts]
        if not shards:
            names.add(name)
        for entry in shards:
            index = parts.index(entry.fused_module)
            names.add(".".join([*parts[:index], entry.hf_module, *parts[index + 1 :]]))
    return names


def _expert_names(name: str, param: nn.Parameter, experts: Sequence[ExpertParam]) -> set[str]:
    """The per-expert checkpoint names that fill the stacked parameter `name` (none when it
    is not one)."""
    parts = name.split(".")
    return {
        ".".join([*parts[:-1], str(expert), entry.hf_module, "weight"])
        for entry in experts
        if parts[-2:] == ["experts", entry.stacked_param]
        for expert in getattr(param, "expert_ids", range(param.shape[0]))
    }
