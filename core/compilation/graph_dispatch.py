"""-O2: which steps replay device graphs, and the static buffers and padding they need.

A step of few tokens spends most of its time launching kernels, a few per layer, each on
a few rows; a captured graph launches them all at once. A graph replays fixed kernels on
fixed addresses, so: the forward's inputs are copied into static buffers; the batch is
padded up to the nearest capture size (the pad rows compute garbage nobody reads); and
what attention reads is either captured with it or rebuilt each step where the graph
reads it. Two kinds of graphs (vLLM's cudagraph modes):

- FULL: the whole forward of a pure-decode batch, attention included. The backend must
  declare `graph_support` and build its metadata into persistent buffers
  (`AttentionMetadataBuilder.reserve`); the batch is padded with requests that have no
  tokens (`pad_decode_batch`).
- PIECEWISE: the compiled forward cut at attention (core.compilation.piecewise), each
  piece captured per size while attention runs eagerly; any batch of up to the largest
  capture size, padded with tokens of no request (`pad_tokens`).

Steps larger than the largest capture size run without graphs.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.attention.interface import CommonAttentionMetadata
from core.config import CUDAGraphMode
from core.forward_context import ForwardContext, set_forward_context
from core.platforms.device_graph import CaptureGraph, DeviceGraph

__all__ = [
    "BatchDescriptor",
    "GraphDispatcher",
    "capture_batch",
    "pad_decode_batch",
    "pad_for_graph",
    "pad_tokens",
]

logger = logging.getLogger(__name__)

_FULL_MODES = (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE)
_PIECEWISE_MODES = (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE)


@dataclass(frozen=True)
class BatchDescriptor:
    """The key of a captured graph: the padded token count, and whether the graph is a
    FULL one (a pure-decode batch: one token per request) or the PIECEWISE ones."""

    num_tokens: int
    uniform_decode: bool


ContextFor = Callable[[BatchDescriptor], ForwardContext]


class GraphDispatcher:
    """The captured graphs of one model forward, their static inputs, and the choice of
    graph for each step."""

    def __init__(
        self,
        mode: CUDAGraphMode,
        capture: CaptureGraph,
        forward: Callable[..., torch.Tensor],
        capture_sizes: list[int],
        device: torch.device,
    ) -> None:
        self.full = mode in _FULL_MODES
        self.piecewise = mode in _PIECEWISE_MODES
        self._capture = capture
        self._forward = forward
        self.capture_sizes = sorted(capture_sizes)
        largest = self.capture_sizes[-1]
        self._input_ids = torch.zeros(largest, dtype=torch.int64, device=device)
        self._positions = torch.zeros(largest, dtype=torch.int64, device=device)
        self._full_graphs: dict[BatchDescriptor, DeviceGraph] = {}
        self.capture_seconds = 0.0  # how long capture_all took

    def descriptor(self, num_reqs: int, num_tokens: int) -> BatchDescriptor | None:
        """The graphs a step of `num_reqs` requests and `num_tokens` tokens replays, or
        None (larger than every capture size, or a kind of batch the mode leaves out)."""
        index = bisect.bisect_left(self.capture_sizes, num_tokens)
        if index == len(self.capture_sizes):
            return None
        size = self.capture_sizes[index]
        if self.full and num_tokens == num_reqs:
            return BatchDescriptor(size, uniform_decode=True)
        if self.piecewise:
            return BatchDescriptor(size, uniform_decode=False)
        return None

    def capture_all(self, context_for: ContextFor) -> None:
        """Capture every size, largest first (smaller graphs then fit in the memory the
        largest reserved): FULL graphs and/or the pieces' graphs. `context_for(descriptor)`
        is the forward context of a padded dummy batch of that kind and size."""
        start = time.perf_counter()
        kinds = [kind for kind, on in ((True, self.full), (False, self.piecewise)) if on]
        for size in reversed(self.capture_sizes):
            for uniform_decode in kinds:
                descriptor = BatchDescriptor(size, uniform_decode)
                with set_forward_context(context_for(descriptor)):
                    self._capture_one(descriptor)
        self.capture_seconds = time.perf_counter() - start
        logger.info(
            "captured graphs for batch sizes %s (%s) in %.1f s",
            self.capture_sizes,
            " and ".join(n for n, on in (("FULL", self.full), ("PIECEWISE", self.piecewise)) if on),
            self.capture_seconds,
        )

    def _capture_one(self, descriptor: BatchDescriptor) -> None:
        ids = self._input_ids[: descriptor.num_tokens]
        positions = self._positions[: descriptor.num_tokens]
        if descriptor.uniform_decode:
            graph = self._capture(lambda: self._forward(ids, positions))
            self._full_graphs[descriptor] = graph
        else:  # the pieces capture themselves (the context names the size)
            self._forward(ids, positions)

    def run(
        self, descriptor: BatchDescriptor, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The forward's output for the real rows, from `descriptor`'s graphs; the caller
        has built this step's padded metadata and set the forward context."""
        num_tokens, size = len(input_ids), descriptor.num_tokens
        self._input_ids[:num_tokens].copy_(input_ids, non_blocking=True)
        self._input_ids[num_tokens:size].zero_()
        self._positions[:num_tokens].copy_(positions, non_blocking=True)
        self._positions[num_tokens:size].zero_()
        if descriptor.uniform_decode:
            graph = self._full_graphs[descriptor]
            graph.replay()
            return graph.output[:num_tokens]
        output = self._forward(self._input_ids[:size], self._positions[:size])
        return output[:num_tokens]

    @property
    def full_descriptors(self) -> list[BatchDescriptor]:
        return list(self._full_graphs)


def pad_for_graph(
    common: CommonAttentionMetadata, graph: BatchDescriptor | None, max_model_len: int
) -> CommonAttentionMetadata:
    """`common` padded for the graphs it replays (unchanged without one)."""
    if graph is None:
        return common
    if graph.uniform_decode:
        return pad_decode_batch(common, graph.num_tokens, max_model_len)
    return pad_tokens(common, graph.num_tokens)


def pad_decode_batch(
    common: CommonAttentionMetadata, size: int, max_model_len: int
) -> CommonAttentionMetadata:
    """A pure-decode step's metadata padded to `size` requests of a FULL graph.

    The pad requests have no new tokens and no context, the pad token rows write nothing
    (slot -1), and max_seq_len is the model's limit, so the launch configuration the
    backend derives is the one it had at capture (see AttentionMetadataBuilder.build).
    """
    pad = size - common.num_reqs
    last = common.query_start_loc[-1:]
    return CommonAttentionMetadata(
        query_start_loc=torch.cat([common.query_start_loc, last.expand(pad)]),
        seq_lens=F.pad(common.seq_lens, (0, pad)),
        num_computed_tokens=F.pad(common.num_computed_tokens, (0, pad)),
        block_table=F.pad(common.block_table, (0, 0, 0, pad)),
        slot_mapping=F.pad(common.slot_mapping, (0, size - common.num_actual_tokens), value=-1),
        num_reqs=size,
        num_actual_tokens=size,
        max_query_len=1,
        max_seq_len=max_model_len,
    )


def pad_tokens(common: CommonAttentionMetadata, size: int) -> CommonAttentionMetadata:
    """A step's metadata with token rows added up to `size` for PIECEWISE graphs: rows of
    no request, which write nothing (slot -1) and whose output nobody reads."""
    return CommonAttentionMetadata(
        query_start_loc=common.query_start_loc,
        seq_lens=common.seq_lens,
        num_computed_tokens=common.num_computed_tokens,
        block_table=common.block_table,
        slot_mapping=F.pad(common.slot_mapping, (0, size - common.num_actual_tokens), value=-1),
        num_reqs=common.num_reqs,
        num_actual_tokens=size,
        max_query_len=common.max_query_len,
        max_seq_len=common.max_seq_len,
    )


def capture_batch(
    descriptor: BatchDescriptor, max_blocks: int, max_model_len: int, device: torch.device
) -> CommonAttentionMetadata:
    """The metadata graphs are captured with. FULL: one-token decodes on an empty context,
    reading the null block (block 0) and writing nothing. PIECEWISE: tokens of no request
    (attention runs outside the captured pieces: what it computes does not matter)."""
    size = descriptor.num_tokens
    num_reqs = size if descriptor.uniform_decode else 0

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.int32, device=device)

    return CommonAttentionMetadata(
        query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32, device=device),
        seq_lens=zeros(num_reqs) + 1,
        num_computed_tokens=zeros(num_reqs),
        block_table=zeros(num_reqs, max_blocks),
        slot_mapping=torch.full((size,), -1, dtype=torch.int64, device=device),
        num_reqs=num_reqs,
        num_actual_tokens=size,
        max_query_len=1 if num_reqs else 0,
        max_seq_len=max_model_len,
    )
