"""Token embedding and the LM head that maps hidden states back onto the vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.quantization.unquantized import dense_linear


class VocabEmbedding(nn.Module):
    """Token ids -> embedding rows."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden_size]
        return F.embedding(input_ids, self.weight)


class LMHead(nn.Module):
    """Hidden states -> vocabulary logits; with `tied_to`, the embedding matrix is reused.

    A tied head shares the embedding's Parameter object, so loading the embedding loads
    the head, and `named_parameters()` lists the matrix once (under the embedding's name).
    The head stays unquantized: quantization methods leave it in full precision.
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        tied_to: VocabEmbedding | None = None,
    ) -> None:
        super().__init__()
        if tied_to is not None:
            self.weight = tied_to.weight
        else:
            self.weight = nn.Parameter(
                torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False
            )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return dense_linear(hidden, self.weight)
