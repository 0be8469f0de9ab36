"""Batch-invariant mode: a request's numbers do not depend on what it is batched with.

Kernels pick their summation order by speed: a GEMV for a decode row, a blocked GEMM for
a batch, a flash kernel for a prefill chunk, a split over threads where there are few
rows. Each order rounds differently, so in bfloat16 (and, near ties, in float32) a greedy
request served alone, among 32 others, in 16-token prefill chunks, from the prefix cache
or under speculative verification can answer differently. In this mode (--batch-invariant,
LLM(batch_invariant=True), CORE_BATCH_INVARIANT=1) every kernel on the forward path
reduces each output row in an order fixed by the model's shapes alone, never by the
number of rows, the row's position in the batch, the chunk it was prefilled in or the
thread count:

- linear layers (dense, packed 4/8-bit, FP8, the LM head, experts): one kernel for every
  row count, whose sums for a row read that row alone (core.kernel_choice chooses only
  candidates whose `batch_invariant` is set, and one of them for every row count);
- attention: every query row, decode or prefill, attends through the same per-row kernel
  over its keys in position order (an attention backend declares
  `AttentionCapabilities.batch_invariant`; the selector takes no other);
- norms, activations, rotary: per-row or elementwise kernels (the references run row by
  row here);
- sampling: per-row softmax and argmax, per-request generators.

The mode is set per process by the worker from the engine's config (`set_enabled`); ops
read `enabled()` at each call. Without it nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

_enabled = False


def enabled() -> bool:
    """Whether this process runs in batch-invariant mode."""
    return _enabled


def set_enabled(on: bool) -> None:
    """Turn the mode on or off for this process (the worker does, from
    ModelConfig.batch_invariant, before it builds the model)."""
    global _enabled
    _enabled = bool(on)


def rowwise(
    fn: Callable[..., torch.Tensor], rows: Sequence[torch.Tensor], *shared: Any
) -> torch.Tensor:
    """fn(*rows, *shared) computed one row at a time: the i-th row of every tensor in
    `rows` (each [..., last], all with the same leading rows) copied into a tensor of its
    own, [1, last], and the results ([1, ...] each) joined in row order, with the leading
    dimensions of rows[0]. torch's kernels choose their blocking, vectorization and thread
    split from the shapes and the data's alignment, so a row computed alone in a fresh
    allocation takes the same path whatever batch it came in: how core's reference ops
    serve the mode."""
    first = rows[0]
    if first.dim() == 0 or first.numel() == 0:
        return fn(*rows, *shared)
    flat = [r.reshape(-1, r.shape[-1]) for r in rows]
    out = torch.cat(
        [fn(*(r[i : i + 1].clone() for r in flat), *shared) for i in range(len(flat[0]))]
    )
    return out.view(*first.shape[:-1], *out.shape[1:])
