"""The lean step: a decoder's layers run as chains of plain callables instead of a tree of
module calls.

Every `nn.Module.__call__` costs microseconds of Python (hook checks, `__getattr__`
lookups), and a decoder layer makes about fourteen a step, around kernels that are
themselves only tens of microseconds at one stream: SmolLM2-135M's 30 layers spent about
8 ms of a 29 ms single-stream decode step in the module tree (AMD EPYC Zen 3, 2 threads,
GGUF weights), against the same kernels called in a flat loop.

A module with a `lean()` method returns a callable that computes its `forward` with the
same kernels in the same order, so its outputs are identical to the bit; a composite
builds it from its parts' lean callables, and falls back to itself where an option it
does not flatten is set. `lean(module)` is that callable, or the module itself where it
has no `lean()` (its `__call__` then runs, hooks and all); a module with forward hooks
registered is called as a module too, whenever they were registered. A `forward` patched
on an instance after its lean callable was made is not seen.

Lean callables capture modules, not tensors or methods that change: a linear layer's
linear method is looked up at each call (LoRA wraps it after loading), and attention
reads the forward context each step. They are made at a model's first eager forward and
never while torch.compile traces (the graph holds the modules' own forward).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module

Lean = Callable[..., Any]
# (positions [T], hidden [T, hidden], residual [T, hidden] | None) -> (hidden, residual)
LeanLayer = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]
]


def lean(module: nn.Module) -> Lean:
    """`module.lean()` where the module has one, else the module itself. While forward
    hooks are registered on the module (or globally), calls go through the module, so its
    hooks run (calibration records linear inputs with pre-hooks)."""
    make = getattr(module, "lean", None)
    if make is None:
        return module
    fast = make()

    def call(*args: Any) -> Any:
        if global_forward_hooks() or has_forward_hooks(module):
            return module(*args)
        return fast(*args)

    return call


def global_forward_hooks() -> bool:
    """Whether a forward hook is registered for every module (torch's global hooks)."""
    return bool(_module._global_forward_pre_hooks or _module._global_forward_hooks)


def has_forward_hooks(module: nn.Module) -> bool:
    """Whether a forward (pre-)hook is registered on `module` itself."""
    return any(hook_dicts(module))


def hook_dicts(module: nn.Module) -> tuple[dict, dict]:
    """The dicts torch registers `module`'s forward pre-hooks and hooks into."""
    return module._forward_pre_hooks, module._forward_hooks
