"""SoftcapLogitsProcessor: the reference LogitsProcessor (core.sample.logits_processor).

A request whose `extra_args` hold `logit_softcap` (a positive number: the server's
`"vllm_xargs": {"logit_softcap": 30}`) has its logits squashed into (-cap, cap) by
`cap * tanh(logits / cap)`, as Gemma 2 caps its final logits: the distribution a
temperature then flattens, with no token more than 2 * cap ahead of another. tanh is
increasing, so the argmax never moves: the processor is argmax-invariant (skipped when
every row is greedy). Not registered: start an engine with
`--logits-processors core.sample.logit_softcap:SoftcapLogitsProcessor` to use it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from core.sample.logits_processor import BatchUpdate, LogitsProcessor, update_row_states
from core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from core.config import EngineConfig

__all__ = ["SoftcapLogitsProcessor"]

ARG = "logit_softcap"


class SoftcapLogitsProcessor(LogitsProcessor):
    def __init__(self, config: EngineConfig, device: torch.device, is_pin_memory: bool) -> None:
        self._caps: dict[int, float] = {}  # batch row -> its request's cap

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        _cap(params)

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        update_row_states(self._caps, batch_update, _cap)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._caps:
            return logits
        rows = torch.tensor(list(self._caps), device=logits.device)  # [R]
        caps = torch.tensor(list(self._caps.values()), dtype=logits.dtype, device=logits.device)
        caps = caps.unsqueeze(-1)  # [R, 1]
        logits[rows] = caps * torch.tanh(logits[rows] / caps)
        return logits


def _cap(params: SamplingParams) -> float | None:
    """The request's cap; None when it asks for none. ValueError naming the argument for a
    value that is not a positive finite number."""
    value = (params.extra_args or {}).get(ARG)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{ARG} must be a positive number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{ARG} must be finite, got {value!r}")
    return float(value)
