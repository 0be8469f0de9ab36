"""PEFT-format LoRA adapters with random weights, and their dense reference.

`write_adapter` saves what `peft`'s `save_pretrained` saves (adapter_config.json and
adapter_model.safetensors with "base_model.model.<module>.lora_A/B.weight" tensors) for
a transformers model, without needing peft; `merged_model` is that model with each
adapted weight replaced by W + scaling * B @ A — the reference a LoRA implementation is
held to. Used by the conformance kit and by core-lora's tests. Needs `transformers`.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

if TYPE_CHECKING:
    import transformers

__all__ = ["AdapterSpec", "merged_model", "write_adapter"]


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter of rank `rank` on every module whose last name is in `targets`."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    use_rslora: bool = False
    seed: int = 0
    magnitude: float = 0.3  # std of A and B: large enough to change greedy choices

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


Deltas = dict[str, tuple[torch.Tensor, torch.Tensor]]  # module name -> (A [r, in], B [out, r])


def write_adapter(
    directory: Path, model: transformers.PreTrainedModel, spec: AdapterSpec
) -> Deltas:
    """Random A and B for `spec`'s modules of `model`, saved in PEFT's format into
    `directory`; returns them."""
    generator = torch.Generator().manual_seed(spec.seed)
    deltas: Deltas = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rpartition(".")[2] in spec.targets:
            a = torch.randn(spec.rank, module.in_features, generator=generator)
            b = torch.randn(module.out_features, spec.rank, generator=generator)
            deltas[name] = (a * spec.magnitude, b * spec.magnitude)
    tensors = {}
    for name, (a, b) in deltas.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = a.contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = b.contiguous()
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "use_rslora": spec.use_rslora,
        "target_modules": sorted(spec.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_dora": False,
        "lora_dropout": 0.0,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return deltas


def merged_model(
    model: transformers.PreTrainedModel, deltas: Deltas, scaling: float
) -> transformers.PreTrainedModel:
    """A copy of `model` whose adapted weights are W + scaling * B @ A (float64 sum)."""
    merged = copy.deepcopy(model)
    modules = dict(merged.named_modules())
    with torch.no_grad():
        for name, (a, b) in deltas.items():
            weight = modules[name].weight
            delta = scaling * (b.double() @ a.double())
            weight.copy_((weight.double() + delta).to(weight.dtype))
    return merged.eval()
