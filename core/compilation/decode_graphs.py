"""-O2: pure-decode batches replayed from device graphs captured at padded sizes.

A decode step spends most of its time launching kernels, a few per layer, each on a few
rows; a captured graph launches them all at once. A graph replays fixed kernels on fixed
addresses, so: the forward's inputs are copied into static buffers; the batch is padded
up to the nearest capture size (the pad rows compute garbage nobody reads); and the
attention backend builds its metadata into persistent buffers
(`AttentionMetadataBuilder.reserve`), so the captured kernels read each step's values.

Graphs are keyed by a `BatchDescriptor`. Only FULL graphs of uniform decode batches are
captured (the backend must declare `graph_support`): mixed prefill/decode steps, steps
with drafts and batches larger than the largest capture size run without a graph.
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
from core.forward_context import ForwardContext, set_forward_context
from core.platforms.device_graph import DeviceGraph

__all__ = ["BatchDescriptor", "DecodeGraphs", "capture_batch", "pad_decode_batch"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchDescriptor:
    """The key of one captured graph."""

    num_tokens: int  # the padded number of tokens (= requests: one each)
    uniform_decode: bool = True  # every request computes exactly one new token


class DecodeGraphs:
    """The captured graphs of one model forward and their static inputs."""

    def __init__(
        self,
        capture: Callable[[Callable[[], torch.Tensor]], DeviceGraph],
        forward: Callable[..., torch.Tensor],
        capture_sizes: list[int],
        device: torch.device,
    ) -> None:
        self._capture = capture
        self._forward = forward
        self.capture_sizes = sorted(capture_sizes)
        largest = self.capture_sizes[-1]
        self._input_ids = torch.zeros(largest, dtype=torch.int64, device=device)
        self._positions = torch.zeros(largest, dtype=torch.int64, device=device)
        self._graphs: dict[BatchDescriptor, DeviceGraph] = {}
        self.capture_seconds = 0.0  # how long capture_all took

    def descriptor(self, num_reqs: int, num_tokens: int) -> BatchDescriptor | None:
        """The graph a step of `num_reqs` requests and `num_tokens` tokens replays, or None
        (not a pure decode, or larger than every capture size)."""
        if num_tokens != num_reqs:
            return None
        index = bisect.bisect_left(self.capture_sizes, num_tokens)
        if index == len(self.capture_sizes):
            return None
        return BatchDescriptor(self.capture_sizes[index])

    def capture_all(self, context_for: Callable[[int], ForwardContext]) -> None:
        """Capture one graph per size, largest first (smaller graphs then fit in the memory
        the largest reserved); `context_for(size)` is the forward context of a padded
        decode batch of that size, its metadata in the builder's persistent buffers."""
        start = time.perf_counter()
        for size in reversed(self.capture_sizes):
            ids, positions = self._input_ids[:size], self._positions[:size]
            with set_forward_context(context_for(size)):
                graph = self._capture(lambda ids=ids, pos=positions: self._forward(ids, pos))
            self._graphs[BatchDescriptor(size)] = graph
        self.capture_seconds = time.perf_counter() - start
        logger.info(
            "captured %d decode graphs (sizes %s) in %.1f s",
            len(self._graphs),
            self.capture_sizes,
            self.capture_seconds,
        )

    def replay(
        self, descriptor: BatchDescriptor, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The forward's output for the real rows, replayed from `descriptor`'s graph; the
        caller has built this step's (padded) metadata into the persistent buffers."""
        num_tokens, size = len(input_ids), descriptor.num_tokens
        self._input_ids[:num_tokens].copy_(input_ids, non_blocking=True)
        self._input_ids[num_tokens:size].zero_()
        self._positions[:num_tokens].copy_(positions, non_blocking=True)
        self._positions[num_tokens:size].zero_()
        graph = self._graphs[descriptor]
        graph.replay()
        return graph.output[:num_tokens]

    @property
    def descriptors(self) -> list[BatchDescriptor]:
        return list(self._graphs)


def pad_decode_batch(
    common: CommonAttentionMetadata, size: int, max_model_len: int
) -> CommonAttentionMetadata:
    """A pure-decode step's metadata padded to `size` requests of a captured graph.

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


def capture_batch(
    size: int, max_blocks: int, max_model_len: int, device: torch.device
) -> CommonAttentionMetadata:
    """The metadata graphs are captured with: `size` decodes of one token on an empty
    context, reading the null block (block 0) and writing nothing."""
    return CommonAttentionMetadata(
        query_start_loc=torch.arange(size + 1, dtype=torch.int32, device=device),
        seq_lens=torch.ones(size, dtype=torch.int32, device=device),
        num_computed_tokens=torch.zeros(size, dtype=torch.int32, device=device),
        block_table=torch.zeros(size, max_blocks, dtype=torch.int32, device=device),
        slot_mapping=torch.full((size,), -1, dtype=torch.int64, device=device),
        num_reqs=size,
        num_actual_tokens=size,
        max_query_len=1,
        max_seq_len=max_model_len,
    )
