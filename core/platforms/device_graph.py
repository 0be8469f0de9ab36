"""The device-graph seam: a platform records a forward once and replays it.

A platform that supports -O2 implements `Platform.capture_graph(fn)`: run `fn` (no
arguments, reading only tensors that stay at the same addresses) into a graph and return
it. Replaying launches the recorded kernels on whatever those tensors hold now and leaves
the result in `output`, the tensor `fn` returned during capture.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch

__all__ = ["CaptureGraph", "DeviceGraph", "TorchCudaGraph"]


class DeviceGraph(ABC):
    """One captured forward (a CUDA graph on CUDA and ROCm)."""

    output: Any  # what the captured call returned (tensors); rewritten by each replay

    @abstractmethod
    def replay(self) -> None:
        """Run the recorded kernels again on the current contents of their inputs."""


CaptureGraph = Callable[[Callable[[], Any]], DeviceGraph]
"""`Platform.capture_graph`: a call of no arguments in, its graph out."""


class TorchCudaGraph(DeviceGraph):
    """A `torch.cuda.CUDAGraph` (HIP graphs on ROCm builds): what the GPU platforms return.

    The call runs once eagerly first, so lazy work (Triton compiling its kernels, the
    allocator growing) happens outside the capture. Every graph of the process shares one
    memory pool: only one of them replays at a time.
    """

    _pool: ClassVar[Any] = None

    def __init__(self, fn: Callable[[], Any]) -> None:
        fn()
        torch.cuda.synchronize()
        if TorchCudaGraph._pool is None:
            TorchCudaGraph._pool = torch.cuda.graph_pool_handle()
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph, pool=TorchCudaGraph._pool):
            self.output = fn()

    def replay(self) -> None:
        self._graph.replay()
