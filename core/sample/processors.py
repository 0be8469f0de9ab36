"""Logits processors that ban, bias or rescale tokens: pure functions of a [B, V] tensor.

Each returns its result (the input itself when it has nothing to do) and never modifies
its input. The sampler applies them
in the order of DESIGN.md section 5; the order of the functions in this file follows it.
Row indices in the dict arguments are batch rows; rows absent from a dict are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from core.sampling_params import SAMPLING_EPS

__all__ = [
    "apply_allowed_token_ids",
    "apply_bad_words",
    "apply_logit_bias",
    "apply_min_p",
    "apply_min_tokens",
    "apply_temperature",
]


def apply_allowed_token_ids(logits: torch.Tensor, allowed_mask: torch.Tensor) -> torch.Tensor:
    """Set every token outside ``allowed_mask`` to -inf.

    logits: [B, V], allowed_mask: [B, V] bool, True where the row may emit the token
    (all True for rows without allowed_token_ids).
    """
    return logits.masked_fill(~allowed_mask, float("-inf"))


def apply_bad_words(
    logits: torch.Tensor,
    bad_words_token_ids: Mapping[int, Sequence[Sequence[int]]],
    output_token_ids: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Ban the last token of each bad word whose other tokens end the output so far.

    A one-token bad word is always banned; a longer one only when emitting its last token
    would complete it. Only generated tokens count, the prompt never does.
    """
    rows, cols = [], []
    for row, sequences in bad_words_token_ids.items():
        output = output_token_ids[row]
        for sequence in sequences:
            prefix = list(sequence[:-1])
            if not prefix or list(output[len(output) - len(prefix) :]) == prefix:
                rows.append(row)
                cols.append(sequence[-1])
    return _fill(logits, rows, cols, float("-inf"))


def apply_logit_bias(
    logits: torch.Tensor, logit_bias: Mapping[int, Mapping[int, float]]
) -> torch.Tensor:
    """Add each row's ``{token_id: bias}`` to its logits."""
    rows = [row for row, bias in logit_bias.items() for _ in bias]
    cols = [token_id for bias in logit_bias.values() for token_id in bias]
    values = [value for bias in logit_bias.values() for value in bias.values()]
    if not rows:
        return logits
    index = _index(logits, rows, cols)
    bias = torch.tensor(values, dtype=logits.dtype, device=logits.device)
    return logits.index_put(index, bias, accumulate=True)


def apply_min_tokens(
    logits: torch.Tensor,
    min_tokens: Mapping[int, tuple[int, set[int]]],
    output_token_ids: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Ban each row's stop token ids (EOS included) while its output is shorter than min_tokens.

    min_tokens: row -> (min_tokens, stop token ids).
    """
    rows, cols = [], []
    for row, (num_min_tokens, stop_token_ids) in min_tokens.items():
        if len(output_token_ids[row]) < num_min_tokens:
            rows.extend(row for _ in stop_token_ids)
            cols.extend(stop_token_ids)
    return _fill(logits, rows, cols, float("-inf"))


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Divide each row by its temperature; greedy rows (temperature < eps) are left as is.

    logits: [B, V], temperature: [B]. Greedy rows take the argmax, which no positive
    divisor moves; dividing them by 1 rather than their ~0 temperature avoids an overflow.
    """
    safe = torch.where(temperature < SAMPLING_EPS, torch.ones_like(temperature), temperature)
    return logits / safe.unsqueeze(-1).to(logits.dtype)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Ban tokens whose probability is below min_p times the row's top probability.

    logits: [B, V], min_p: [B] (0 keeps every token). Runs after temperature, as min_p is
    defined on the distribution actually sampled from; it never bans the argmax.
    """
    probs = logits.softmax(dim=-1)  # [B, V]
    threshold = min_p.to(probs.dtype).unsqueeze(-1) * probs.amax(dim=-1, keepdim=True)  # [B, 1]
    return logits.masked_fill(probs < threshold, float("-inf"))


def _index(
    logits: torch.Tensor, rows: list[int], cols: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    device = logits.device
    return (
        torch.tensor(rows, dtype=torch.int64, device=device),
        torch.tensor(cols, dtype=torch.int64, device=device),
    )


def _fill(logits: torch.Tensor, rows: list[int], cols: list[int], value: float) -> torch.Tensor:
    if not rows:
        return logits
    fill = torch.full((len(rows),), value, dtype=logits.dtype, device=logits.device)
    return logits.index_put(_index(logits, rows, cols), fill)
