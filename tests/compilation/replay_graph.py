"""A stand-in for CUDA graphs on the CPU: replay runs the captured call again under the
forward context it was captured in, so it reads exactly what a real graph would (the
static input buffers and the metadata objects of capture time, whatever they hold now)."""

from __future__ import annotations

from collections.abc import Callable

import torch

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
            self.output.copy_(self._fn())
        self.replays += 1
