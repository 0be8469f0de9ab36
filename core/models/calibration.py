"""Running a core model on its own, one token sequence at a time: linear inputs, perplexity.

Tools that look at what a model computes on some text (activation-aware quantization's
calibration, the quality benchmark's perplexity) build it with `core.models.build_model`
and run it outside the engine: no scheduler, no batching; each sequence is prefilled in
one step from an empty context on the reference attention backend, with a KV cache of its
own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from core.attention.backends.torch_ref import TorchRefBackend, bind_reference_backend
from core.attention.interface import CommonAttentionMetadata
from core.attention.layer import Attention
from core.forward_context import ForwardContext, set_forward_context
from core.models.layers.linear import LinearBase

__all__ = ["forward_sequence", "perplexity", "record_linear_inputs"]

BLOCK_SIZE = 16
_LOGIT_ROWS = 512  # logits [rows, vocab] materialized at once by `perplexity`


def forward_sequence(model: nn.Module, token_ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states [T, hidden] of the sequence `token_ids` [T], prefilled in one step.

    Binds the reference attention backend and a fresh KV cache of the sequence's length
    to every attention layer of `model` (replacing whatever was bound).
    """
    num_tokens = token_ids.shape[0]
    num_blocks = math.ceil(num_tokens / BLOCK_SIZE)
    common = _prefill_metadata(num_tokens, num_blocks)
    metadata = {}
    for layer in (m for m in model.modules() if isinstance(m, Attention)):
        bind_reference_backend(layer, num_blocks, BLOCK_SIZE)
        builder = TorchRefBackend.get_builder_cls()(
            layer.kv_cache_spec(BLOCK_SIZE, torch.float32), [layer.layer_name], token_ids.device
        )
        metadata[layer.layer_name] = builder.build(common)
    positions = torch.arange(num_tokens)
    with torch.inference_mode(), set_forward_context(ForwardContext(metadata, num_tokens)):
        return model(token_ids, positions)


def record_linear_inputs(
    model: nn.Module, sequences: Iterable[torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The input of every linear layer of `model` over `sequences` (each [T_i] token ids).

    Keyed by the layer's prefix (e.g. "model.layers.0.self_attn.qkv_proj"); each value is
    [sum T_i, input_size] float32, the rows of all sequences in order (a copy, taken
    before the layer's matmul).
    """
    recorded: dict[str, list[torch.Tensor]] = {}
    handles = []
    for module in model.modules():
        if isinstance(module, LinearBase):
            rows = recorded.setdefault(module.prefix, [])
            handles.append(module.register_forward_pre_hook(partial(_keep_input, rows)))
    try:
        for token_ids in sequences:
            forward_sequence(model, token_ids)
    finally:
        for handle in handles:
            handle.remove()
    # Concatenated one layer at a time, so memory peaks at the rows plus one layer's copy.
    return {prefix: torch.cat(recorded.pop(prefix)) for prefix in list(recorded)}


def perplexity(model: nn.Module, token_ids: Sequence[int] | torch.Tensor, window: int) -> float:
    """exp(mean negative log-likelihood) of `token_ids` under `model`.

    The sequence is cut into consecutive windows of `window` tokens (the last may be
    shorter; keep `window` within the model's context length); each runs from an empty
    context, and every token of a window but its first is predicted from the ones before
    it. The mean is over all predicted tokens. ValueError when `window` < 2 or nothing is
    predicted.
    """
    if window < 2:
        raise ValueError(f"perplexity window should be at least 2 tokens, got {window}")
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    total, count = 0.0, 0
    for start in range(0, ids.shape[0], window):
        chunk = ids[start : start + window]
        if chunk.shape[0] > 1:
            total += _sum_nll(model, chunk)
            count += chunk.shape[0] - 1
    if count == 0:
        raise ValueError(f"perplexity needs at least 2 tokens, got {ids.shape[0]}")
    return math.exp(total / count)


def _sum_nll(model: nn.Module, token_ids: torch.Tensor) -> float:
    """Sum over positions t >= 1 of -log p(token_ids[t] | token_ids[:t])."""
    hidden = forward_sequence(model, token_ids)[:-1]  # [T - 1, hidden]: predicts ids[1:]
    targets = token_ids[1:]
    total = 0.0
    with torch.inference_mode():
        for start in range(0, targets.shape[0], _LOGIT_ROWS):
            rows = slice(start, start + _LOGIT_ROWS)
            logits = model.compute_logits(hidden[rows]).float()  # [rows, vocab]
            nll = F.cross_entropy(logits, targets[rows], reduction="sum")
            total += nll.double().item()
    return total


def _keep_input(rows: list[torch.Tensor], module: nn.Module, args: tuple[torch.Tensor]) -> None:
    rows.append(args[0].detach().float().clone())


def _prefill_metadata(num_tokens: int, num_blocks: int) -> CommonAttentionMetadata:
    """One request of `num_tokens` new tokens, none cached, in blocks 0..num_blocks-1."""
    return CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32),
        num_computed_tokens=torch.tensor([0], dtype=torch.int32),
        block_table=torch.arange(num_blocks, dtype=torch.int32)[None],
        slot_mapping=torch.arange(num_tokens),
        num_reqs=1,
        num_actual_tokens=num_tokens,
        max_query_len=num_tokens,
        max_seq_len=num_tokens,
    )
