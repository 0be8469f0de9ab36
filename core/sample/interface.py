"""The Sampler extension point: logits of a batch in, one token per request out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from core.sample.logprobs import LogprobsTensors
from core.sample.metadata import SamplingMetadata

__all__ = ["Sampler", "SamplerOutput"]


@dataclass
class SamplerOutput:
    """What the sampler hands back to the model runner.

    sampled_token_ids: [num_reqs] int64, one token per request
    logprobs:          raw-logit logprobs of the sampled tokens and the top
                       ``max_num_logprobs`` alternatives, None when no request asked
    """

    sampled_token_ids: torch.Tensor
    logprobs: LogprobsTensors | None


class Sampler(nn.Module, ABC):
    """Turns the last-position logits of a batch into one token per request.

    Registered under the ``core.samplers`` entry-point group. The engine builds one instance
    per worker, passing the JSON of ``--sampler-config`` as keyword arguments to
    ``__init__``, and calls it once per step. Contract of ``forward``:

    - Stateless between calls: everything per request (parameters, generated tokens,
      generators) arrives in ``SamplingMetadata``; the batch changes every step.
    - Logprobs come from the raw logits (log_softmax in float32, snapshotted before any
      processing): they describe the model's distribution, not the penalized one.
    - Order (DESIGN.md section 5): float32 -> allowed / bad tokens -> non-argmax-invariant
      processors (logit bias, min_tokens, then the custom ones:
      `metadata.logits_processors.apply(logits, argmax_invariant=False)`) -> penalties ->
      temperature -> argmax-invariant processors (min_p, then
      `metadata.logits_processors.apply(logits, argmax_invariant=True)`, which may be
      skipped when every row is greedy) -> top-k / top-p -> sample. Penalties precede
      temperature so a penalty means the same thing at every temperature.
    - Rows with temperature < SAMPLING_EPS are greedy: the argmax of the logits after the
      processors and penalties.
    - Determinism: a seeded row draws its randomness only from its own generator in
      ``metadata.generators``, so its token depends on its logits, parameters and seed,
      never on its batch mates or its position in the batch.
    - Never modifies ``logits`` or ``metadata``; only the seeded rows' generators advance.
    """

    @abstractmethod
    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """logits: [num_reqs, vocab_size] in the model's dtype."""

    def process_logits(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """The logits ``forward`` draws from: [B, V] float32, every processor applied.

        Speculative decoding verifies drafts against these (core.spec_decode's
        RejectionSampler), so they must be exactly what ``forward`` samples:

        - The DESIGN.md order: float32 -> allowed / bad tokens -> logit bias, min_tokens ->
          penalties -> temperature (random rows; greedy rows are divided by 1) -> min_p ->
          top-k / top-p.
        - Random rows: softmax of the row is exactly the distribution ``forward`` samples.
        - Greedy rows: the argmax of the row (lowest token id among ties) is exactly the
          token ``forward`` returns; nothing else about them is promised, as an
          implementation may skip the steps that never move the argmax.
        - Never modifies ``logits`` or ``metadata``; the result may share memory with
          ``logits`` when no processor applies, so callers must not write to it.

        A sampler that does not implement it works, but cannot verify drafts.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot verify speculative drafts: "
            "it does not implement process_logits"
        )
