"""SamplingMetadata: the batch's sampling parameters as tensors, one row per request.

The worker's persistent batch owns it and rebuilds or patches it each step; the sampler only
reads it. Optional tensors are None when no row in the batch uses the feature, so the
sampler's fast path skips that processor entirely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from core.sample.penalties import pad_token_ids
from core.sampling_params import SamplingParams, SamplingType

if TYPE_CHECKING:
    from core.sample.logits_processors import StepLogitsProcessors

__all__ = ["SamplingMetadata"]


@dataclass
class SamplingMetadata:
    """Sampling state of a batch of B requests over a vocabulary of V tokens.

    temperature:          [B] float32; rows below SAMPLING_EPS are greedy
    all_greedy/all_random: every row greedy / no row greedy
    top_p:                [B] float32 (1.0 = off) or None
    top_k:                [B] int64 (V = off) or None
    min_p:                [B] float32 (0.0 = off) or None
    generators:           row -> torch.Generator of each seeded random row; the worker keeps
                          one per request across steps so a seed yields a sequence
    max_num_logprobs:     the most logprobs any row asked for, None when none did
    output_token_ids:     row -> generated tokens so far (the worker appends in place)
    prompt_token_ids:     [B, L] int64 padded with V, or None (only repetition needs it)
    presence_penalties,
    frequency_penalties:  [B] float32 each, both None when no row uses either
    repetition_penalties: [B] float32 (1.0 = off) or None
    min_tokens:           row -> (min_tokens, stop token ids incl. EOS) while it applies
    logit_bias:           row -> {token_id: bias}
    allowed_token_ids_mask: [B, V] bool, True where the row may emit the token, or None
    bad_words_token_ids:  row -> token-id sequences to ban
    logits_processors:    the engine's custom processors (core.sample.logits_processor) for
                          these rows, or None: `apply(logits, argmax_invariant=False)` beside
                          logit bias and min_tokens, `apply(..., argmax_invariant=True)`
                          beside min_p (skipped when all rows are greedy)
    """

    temperature: torch.Tensor
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None
    top_k: torch.Tensor | None
    min_p: torch.Tensor | None
    generators: dict[int, torch.Generator]
    max_num_logprobs: int | None
    output_token_ids: list[list[int]]
    prompt_token_ids: torch.Tensor | None = None
    presence_penalties: torch.Tensor | None = None
    frequency_penalties: torch.Tensor | None = None
    repetition_penalties: torch.Tensor | None = None
    min_tokens: dict[int, tuple[int, set[int]]] = field(default_factory=dict)
    logit_bias: dict[int, dict[int, float]] = field(default_factory=dict)
    allowed_token_ids_mask: torch.Tensor | None = None
    bad_words_token_ids: dict[int, list[list[int]]] = field(default_factory=dict)
    logits_processors: StepLogitsProcessors | None = None

    def __post_init__(self) -> None:
        if (self.presence_penalties is None) != (self.frequency_penalties is None):
            raise ValueError("presence_penalties and frequency_penalties must be set together")
        if self.repetition_penalties is not None and self.prompt_token_ids is None:
            raise ValueError("prompt_token_ids must be set when repetition_penalties is")

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams],
        *,
        output_token_ids: list[list[int]],
        prompt_token_ids: Sequence[Sequence[int]],
        vocab_size: int,
        generators: Mapping[int, torch.Generator] | None = None,
        eos_token_id: int | None = None,
        device: torch.device | str = "cpu",
        logits_processors: StepLogitsProcessors | None = None,
    ) -> SamplingMetadata:
        """Build the metadata of a batch from scratch, row i from ``params[i]``.

        ``params`` must have passed ``SamplingParams.verify`` for this vocabulary.
        ``generators`` must hold one generator on ``device`` for every seeded random row.
        ``logits_processors``: the custom processors of these rows (None: none).
        """
        _check_rows(params, output_token_ids, prompt_token_ids)
        generators = dict(generators or {})
        _check_generators(params, generators)
        types = [p.sampling_type for p in params]
        temperature = _tensor([p.temperature for p in params], torch.float32, device)
        presence, frequency = _output_penalties(params, device)
        repetition = _optional([p.repetition_penalty for p in params], 1.0, torch.float32, device)
        # Only the repetition penalty looks at the prompt: skip padding it otherwise.
        prompt = None if repetition is None else pad_token_ids(prompt_token_ids, vocab_size, device)
        return cls(
            temperature=temperature,
            all_greedy=all(t == SamplingType.GREEDY for t in types),
            all_random=all(t != SamplingType.GREEDY for t in types),
            top_p=_optional([p.top_p for p in params], 1.0, torch.float32, device),
            top_k=_optional(_top_k_values(params, vocab_size), vocab_size, torch.int64, device),
            min_p=_optional([p.min_p for p in params], 0.0, torch.float32, device),
            generators=generators,
            max_num_logprobs=max(
                (p.logprobs for p in params if p.logprobs is not None), default=None
            ),
            output_token_ids=output_token_ids,
            prompt_token_ids=prompt,
            presence_penalties=presence,
            frequency_penalties=frequency,
            repetition_penalties=repetition,
            min_tokens=_min_tokens(params, eos_token_id),
            logit_bias={row: dict(p.logit_bias) for row, p in enumerate(params) if p.logit_bias},
            allowed_token_ids_mask=_allowed_mask(params, vocab_size, device),
            bad_words_token_ids={
                row: p.bad_words_token_ids for row, p in enumerate(params) if p.bad_words_token_ids
            },
            logits_processors=logits_processors,
        )


def _check_rows(
    params: Sequence[SamplingParams],
    output_token_ids: Sequence[Sequence[int]],
    prompt_token_ids: Sequence[Sequence[int]],
) -> None:
    for name, rows in (
        ("output_token_ids", output_token_ids),
        ("prompt_token_ids", prompt_token_ids),
    ):
        if len(rows) != len(params):
            raise ValueError(
                f"{name} must have one row per params ({len(params)}), got {len(rows)}"
            )


def _check_generators(
    params: Sequence[SamplingParams], generators: Mapping[int, torch.Generator]
) -> None:
    for row, p in enumerate(params):
        if p.sampling_type == SamplingType.RANDOM_SEED and row not in generators:
            raise ValueError(f"generators must hold a generator for seeded row {row}")


def _tensor(values: list, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def _optional(
    values: list, neutral: float, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor | None:
    """A tensor of ``values``, or None when every row holds the neutral (feature-off) value."""
    if all(v == neutral for v in values):
        return None
    return _tensor(values, dtype, device)


def _top_k_values(params: Sequence[SamplingParams], vocab_size: int) -> list[int]:
    return [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params]


def _output_penalties(
    params: Sequence[SamplingParams], device: torch.device | str
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(presence, frequency) tensors, both None when no row uses either."""
    presence = [p.presence_penalty for p in params]
    frequency = [p.frequency_penalty for p in params]
    if not any(presence) and not any(frequency):
        return None, None
    return _tensor(presence, torch.float32, device), _tensor(frequency, torch.float32, device)


def _min_tokens(
    params: Sequence[SamplingParams], eos_token_id: int | None
) -> dict[int, tuple[int, set[int]]]:
    result = {}
    for row, p in enumerate(params):
        stop_token_ids = p.all_stop_token_ids(eos_token_id)
        if p.min_tokens > 0 and stop_token_ids:
            result[row] = (p.min_tokens, stop_token_ids)
    return result


def _allowed_mask(
    params: Sequence[SamplingParams], vocab_size: int, device: torch.device | str
) -> torch.Tensor | None:
    if all(p.allowed_token_ids is None for p in params):
        return None
    mask = torch.ones(len(params), vocab_size, dtype=torch.bool, device=device)  # [B, V]
    for row, p in enumerate(params):
        if p.allowed_token_ids is not None:
            mask[row] = False
            mask[row, p.allowed_token_ids] = True
    return mask
