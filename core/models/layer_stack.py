"""Layer stacks: a stage's plain decoder layers run in one call of a kernel package.

The lean step (core.models.lean_step) still calls about eleven kernel ops per layer, each
through Python: at one stream the forward of SmolLM2-135M's 30 layers took 21.8 ms of
which its kernels took about 11 (AMD EPYC Zen 3, 2 threads, GGUF weights). A kernel
package that can run whole layers natively registers a `StackBuilder`; a model whose
layers are all plain (`PlainLayer`: nothing but the Llama parts) asks `build_stack` for
one at its first eager forward and offers it every step before running its layers.

A stack's contract (what a builder returns, when it returns one):
- `stack(positions, hidden, residual)` takes and returns what the layers' own calls do
  (`core.models.lean_step.LeanLayer`), for all its layers in order, and its outputs equal,
  to the bit, those of running the layers one after another: the same kernels in the same
  order, on the same inputs.
- It returns None to decline a step it cannot serve (then the layers run as usual): a
  kind of step it has no kernel for (prefill chunks, the dummy run without attention
  metadata), settings it does not read, or a part that changed since it was built (a
  linear method wrapped after loading, as LoRA does). It reads the forward context at each
  call. It may keep the modules' tensors (parameters, buffers and KV caches keep their
  identity for the model's life: sleep mode empties and refills them in place), but must
  see what is rebound: a linear layer's `linear_method`, an attention layer's `impl` and
  `kv_cache`.
- It runs no module's hooks: `build_stack` wraps it so that while any forward hook is
  registered (on a part or globally) the step is declined.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from core.models.lean_step import global_forward_hooks, hook_dicts

# (positions [T], hidden [T, hidden], residual [T, hidden] | None) -> (hidden, residual)
# or None: the step declined.
LayerStack = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor] | None
]


@dataclass(frozen=True)
class PlainLayer:
    """A pre-norm decoder layer of the plain Llama parts alone, as its `forward` runs them:

        h, residual = input_norm(hidden, residual)   (input_norm(hidden) and residual =
                                                      hidden for the stack's first layer)
        q, k, v = split(qkv_proj(h), [q_size, kv_size, kv_size])
        rotary(positions, q as [T, num_heads, head_dim], k as [T, num_kv_heads, head_dim])
        h = o_proj(attn(q, k, v))
        h, residual = post_norm(h, residual)
        hidden = down_proj(silu_and_mul(gate_up_proj(h)))      -> (hidden, residual)

    The norms are `RMSNorm`s (not Gemma's), the linear layers have no bias and no tensor
    parallelism, the rotary turns whole heads, the attention has no soft-capping. The
    fields are the modules themselves.
    """

    input_norm: nn.Module
    qkv_proj: nn.Module
    rotary: nn.Module
    attn: nn.Module
    o_proj: nn.Module
    post_norm: nn.Module
    gate_up_proj: nn.Module
    down_proj: nn.Module
    q_size: int
    kv_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def modules(self) -> tuple[nn.Module, ...]:
        return (self.input_norm, self.qkv_proj, self.rotary, self.attn, self.o_proj,
                self.post_norm, self.gate_up_proj, self.down_proj)  # fmt: skip


# The layers -> their stack, or None where the package cannot run them.
StackBuilder = Callable[[Sequence[PlainLayer]], LayerStack | None]

_BUILDERS: dict[str, StackBuilder] = {}


def register_stack_builder(provider: str, builder: StackBuilder) -> None:
    """Offer `builder` for models' plain layers (re-entrant: a provider's newest counts).
    Kernel packages call it from their `core.general` entry point."""
    _BUILDERS[provider] = builder


def providers() -> list[str]:
    """The providers of the registered builders, in the order they are asked."""
    return list(_BUILDERS)


def build_stack(layers: Sequence[PlainLayer]) -> LayerStack | None:
    """The first registered builder's stack for `layers`, or None (none takes them),
    declining every step while a forward hook is registered on a part or globally."""
    for builder in _BUILDERS.values():
        stack = builder(layers)
        if stack is not None:
            return _without_hooks(stack, [m for layer in layers for m in layer.modules()])
    return None


def _without_hooks(stack: LayerStack, modules: list[nn.Module]) -> LayerStack:
    # torch registers a module's forward (pre-)hooks into these dicts, which stay the
    # module's for its life: one C-level pass over them a step, where a check per module
    # cost ~0.2 ms (SmolLM2's 240 parts).
    hooks = [hook for module in modules for hook in hook_dicts(module)]

    def call(
        positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if global_forward_hooks() or any(hooks):
            return None
        return stack(positions, hidden, residual)

    return call
