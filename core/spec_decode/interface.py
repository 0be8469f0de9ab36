"""The speculative-decoding extension points: Proposer (drafts) and RejectionSampler (verify).

Each step, a request that has drafts d1..dn (from the previous step's proposal) is
scheduled with n + 1 tokens: its last token and the drafts. The target model computes
logits at all n + 1 positions in one forward; the rejection sampler keeps the longest
prefix of drafts the target agrees with and adds one token of its own (the correction at
the first rejection, or a bonus token when all n were accepted), so a step emits 1..n + 1
tokens and the output distribution is exactly the target's. Then the proposer looks at the
batch (accepted tokens appended) and drafts up to k tokens per request for the next step.

Proposers are plugins (entry-point group `core.spec_proposers`, value: the class; the
`core-spec-decode` distribution provides `ngram`, `draft_model` and `layer_skip`); the
rejection sampler is core's (`core.spec_decode.rejection_sampler`), behind this ABC so a
platform can bring a fused kernel. Both have conformance checks in `core.testing`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from core.forward_context import ForwardContext
from core.sample.metadata import SamplingMetadata
from core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from core.attention.layer import Attention
    from core.config import EngineConfig, SpeculativeConfig
    from core.kv_cache.spec import KVCacheSpec
    from core.models.arch_config import ArchConfig

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "NoOptions",
    "ProposalBatch",
    "Proposer",
    "ProposerContext",
    "RejectionSampler",
]

PLACEHOLDER_TOKEN_ID = -1
"""Pads the rejection sampler's [num_reqs, max_drafts + 1] output past each request's end."""


class NoOptions(BaseModel):
    """The options model of a proposer that takes none beyond `num_speculative_tokens`."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class ProposerContext:
    """What a proposer may use when it is built, in the worker, after the target loaded.

    `load_model(path)` loads any checkpoint core can serve as (model, ArchConfig), on the
    worker's device and dtype, with its attention layers named under `prefix` so they never
    collide with the target's (a draft model); the proposer binds no backend itself: the
    worker binds every layer `Proposer.attention_layers` returns, and gives them KV caches.
    """

    engine_config: EngineConfig
    target_model: nn.Module
    target_arch: ArchConfig
    device: torch.device
    dtype: torch.dtype
    load_model: Callable[[str, str], tuple[nn.Module, ArchConfig]]  # (path, prefix)


@dataclass
class ProposalBatch:
    """The worker's batch after a step's verification, as a proposer sees it (read-only).

    token_ids:           [R, L] int64; row r's known tokens (prompt, output, and this
                         step's accepted and new tokens) are token_ids[r, :num_tokens[r]];
                         what lies past them is undefined
    num_tokens:          [R] int64
    num_computed_tokens: [R] int64; tokens whose KV the target had before this step
    num_committed_tokens: [R] int64; tokens settled after this step: positions
                         [num_computed_tokens[r], num_committed_tokens[r]) are what this step
                         committed (a prefill chunk; or the verified tokens and the new one),
                         which a proposer with its own KV cache must compute. Equals
                         num_tokens for a row that sampled. L (token_ids' width) is
                         max_model_len: no position may reach it.
    propose_rows:        sorted rows that sampled this step and want drafts; the others
                         (a partial prefill chunk, a request on a speculation pause) get none
    forward_context:     (rows [T], positions [T]) -> the ForwardContext of a forward over
                         those tokens (rows ascending, each row's positions consecutive,
                         every earlier position of the row already in the KV cache) for
                         every attention layer the worker bound, draft layers included
    """

    req_ids: list[str]
    token_ids: np.ndarray
    num_tokens: np.ndarray
    num_computed_tokens: np.ndarray
    num_committed_tokens: np.ndarray
    propose_rows: np.ndarray
    sampling_params: list[SamplingParams]
    num_speculative_tokens: int
    forward_context: Callable[[np.ndarray, np.ndarray], ForwardContext]


class Proposer(ABC):
    """Drafts tokens for the next step; one instance per worker.

    Registered under `core.spec_proposers` with the method's name (the "method" of
    `--speculative-config`). Contract:

    - `options_model` is a pydantic model of the method's own keys of the config (every key
      but "method" and "num_speculative_tokens"); the frontend validates them with it
      before any engine starts, so a bad key is a ValueError naming it.
    - `__init__(config, context)` runs in the worker once the target is loaded; it may load
      a draft model (through `context.load_model`) and raises ValueError naming the
      `speculative_config.<field>` at fault (e.g. a draft whose vocabulary differs).
    - `writes_kv_cache`: True when `propose` runs attention layers (a draft model, the
      target's own layers): the scheduler then reserves k lookahead slots per request, so
      positions up to num_tokens + k - 1 have KV slots. A proposer may write KV only at
      positions >= its row's `num_computed_tokens` (the target recomputes them; cached
      prefix blocks are never written).
    - `min_acceptance_rate`: a request whose recent drafts were accepted less often than
      this drafts nothing for a while (core.spec_decode.gate); a proposer whose drafts cost
      little may lower it.
    - `attention_layers()` are layers it owns that need their own KV cache (a draft model's);
      the worker binds them to the backend and a KV cache group like the target's.
    - `propose(batch)` returns one list per `batch.propose_rows` entry, in order, of at most
      `batch.num_speculative_tokens` token ids in the target's vocabulary (maybe empty).
      The engine trims drafts that would pass max_tokens, max_model_len or a grammar.
      Drafts change nothing but speed: any drafts leave the output distribution the same.
    """

    options_model: ClassVar[type[BaseModel]] = NoOptions
    writes_kv_cache: ClassVar[bool] = False
    min_acceptance_rate: ClassVar[float] = 0.2

    def __init__(self, config: SpeculativeConfig, context: ProposerContext) -> None:
        self.config = config
        self.context = context

    def attention_layers(self) -> list[Attention]:
        """Attention layers this proposer owns that need KV caches; none by default."""
        return []

    def kv_cache_spec(self, block_size: int, dtype: torch.dtype) -> dict[str, KVCacheSpec]:
        """The KV-cache spec of each layer `attention_layers` returns, by layer name."""
        return {
            layer.layer_name: layer.kv_cache_spec(block_size, dtype)
            for layer in self.attention_layers()
        }

    @abstractmethod
    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        """Drafts for each of `batch.propose_rows`, at most `num_speculative_tokens` each."""


class RejectionSampler(ABC):
    """Verifies drafts against the target's distribution: exact, whatever the drafts.

    forward(logits, metadata, num_draft_tokens, draft_token_ids, draft_probs):

    - `logits` [N, V] float32 are the target's *processed* logits (Sampler.process_logits:
      every processor, penalty, temperature, min_p, top-k / top-p and grammar mask applied)
      at N = sum(n_r + 1) positions, request by request: for request r, rows for its n_r
      draft positions, then one for the position after its last draft. The processors saw,
      at each position, the output as it would be had the drafts before it been accepted.
    - `metadata` has one row per logits row; `temperature` says which rows are greedy, and
      `generators` maps a seeded request's rows to its one generator.
    - `num_draft_tokens` [R] n_r per request; `draft_token_ids` [sum n_r] int64;
      `draft_probs` [sum n_r, V] the draft distributions q the drafts were drawn from, or
      None when the drafts were chosen deterministically (q is then one-hot on the draft).
    - Returns [R, max(n_r) + 1] int64: request r's accepted drafts, then its one target
      token, then PLACEHOLDER_TOKEN_ID padding. Greedy rows: accept while the draft is the
      argmax, then the argmax. Random rows: accept d with probability min(1, p(d) / q(d));
      at the first rejection draw from normalize(max(0, p - q)); when all n_r are
      accepted, draw a bonus token from p at the last row. So every emitted token is
      distributed exactly as sampling the target token by token would be.
    - A seeded request draws only from its own generator, in a fixed order, so its output
      depends on its logits, drafts, parameters and seed, never on its batch mates.
    - Never modifies its inputs.
    """

    @abstractmethod
    def forward(
        self,
        logits: torch.Tensor,
        metadata: SamplingMetadata,
        num_draft_tokens: list[int],
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The emitted tokens per request, [R, max(n_r) + 1], padded with PLACEHOLDER_TOKEN_ID."""

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.forward(*args, **kwargs)
