"""Pipeline stages of a model: which decoder layers a pipeline-parallel rank runs, the
placeholders of the others, and the tensors one stage hands the next.

Each rank builds only its stage: its slice of the decoder layers (`stage_layers`), the
embedding on the first stage, the final norm and LM head on the last (and the embedding
there too when the head is tied to it). The modules of other stages are `MissingLayer`s:
no parameters, so the loader skips their checkpoint tensors and the KV cache holds only
this stage's attention layers. A stage that is not the last returns IntermediateTensors,
which the model runner sends to the next stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["IntermediateTensors", "MissingLayer", "stage_layers", "too_many_stages"]


def stage_layers(num_layers: int, stage: int, num_stages: int) -> tuple[int, int]:
    """[start, end) of the decoder layers of `stage` among `num_stages`: equal shares,
    the earlier stages taking one fewer when they do not divide evenly (the last stage
    also runs the LM head). ValueError naming --pipeline-parallel-size when a stage would
    get no layer."""
    problem = too_many_stages(num_layers, num_stages)
    if problem is not None:
        raise ValueError(problem)
    bounds = [i * num_layers // num_stages for i in range(num_stages)]
    bounds.append(num_layers)
    return bounds[stage], bounds[stage + 1]


def too_many_stages(num_layers: int, num_stages: int) -> str | None:
    """Why `num_stages` pipeline stages cannot share `num_layers` decoder layers (a stage
    would get none), naming the flag; None when they can. The configuration rule
    pipeline-stages refuses it at start, before any stage is built."""
    if num_stages <= num_layers:
        return None
    return (
        f"--pipeline-parallel-size {num_stages} is more than the model's {num_layers} "
        "decoder layers"
    )


class MissingLayer(nn.Module):
    """A module another pipeline stage holds: no parameters; running it is a bug."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("this module belongs to another pipeline stage")


@dataclass
class IntermediateTensors:
    """What a stage hands the next one: {"hidden_states": [T, hidden], ...}."""

    tensors: dict[str, torch.Tensor]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]
