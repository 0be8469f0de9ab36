"""The forward context: per-step data the attention layers read without the model knowing.

The model's forward signature stays (input_ids, positions); the model runner sets the
context around the forward so each Attention layer finds its backend metadata by its
layer name. It is the one deliberate implicit channel (STYLE.md habit 6), set and
cleared by a context manager.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ForwardContext:
    attn_metadata: dict[str, Any]  # layer name -> that layer's backend metadata this step
    num_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)
    # Each token's LoRA adapter, in the form the LoRAManager's layers read (None: no LoRA).
    lora_mapping: Any = None
    # Layer name -> core.attention.layer.Attention: how the `core::unified_attention` op,
    # which a compiled graph calls with the layer's name only, finds the layer's kernel
    # and KV cache. Empty when the model runs eagerly (each layer calls its kernel).
    attention_layers: dict[str, Any] = field(default_factory=dict)
    # -O2 PIECEWISE: the padded token count whose captured graphs the compiled pieces
    # replay (core.compilation.piecewise); None runs them without graphs.
    piecewise_size: int | None = None
    # --kv-transfer-config's connector (worker role): each attention layer waits for its
    # KV to load before attending and hands its KV to save after (None: no connector).
    kv_connector: Any = None


_current: ForwardContext | None = None


@contextmanager
def set_forward_context(context: ForwardContext) -> Iterator[ForwardContext]:
    global _current
    previous, _current = _current, context
    try:
        yield context
    finally:
        _current = previous


def get_forward_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError("no forward context is set: run the model inside set_forward_context")
    return _current
