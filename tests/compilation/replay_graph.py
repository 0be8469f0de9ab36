"""A stand-in for CUDA graphs on the CPU: replay runs the captured call again under the
forward context it was captured in and copies the result into the captured output, so it
reads exactly what a real graph would (the tensors and metadata objects of capture time,
whatever they hold now) and writes where a real one would."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._pytree import tree_leaves

from core.forward_context import get_forward_context, set_forward_context
from core.platforms.device_graph import DeviceGraph


class ReplayGraph(DeviceGraph):
    def __init__(self, fn: Callable[[], torch.Tensor]) -> None:
        self._fn = fn
        self._context = get_forward_context()
        self.output = fn()
        self.replays = 0

    def replay(self) -> None:
        with set_forward_context(self._context):
            fresh = self._fn()
        for static, value in zip(tree_leaves(self.output), tree_leaves(fresh), strict=True):
            if isinstance(static, torch.Tensor):
                static.copy_(value)
        self.replays += 1
