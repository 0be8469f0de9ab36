"""ModelRunnerOutput: what the workers computed in one step (scheduler/worker contract)."""

from __future__ import annotations

import msgspec


class LogprobsLists(msgspec.Struct, kw_only=True):
    """Logprobs of N positions as plain lists (column 0 is the chosen token).

    logprob_token_ids[i] and logprobs[i] hold k + 1 entries: the chosen token, then the
    top k tokens of the raw distribution; `ranks[i]` is the chosen token's rank (1 = best).
    """

    logprob_token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]


class ModelRunnerOutput(msgspec.Struct, kw_only=True):
    req_ids: list[str]  # every request scheduled this step, in batch order
    # One list per request: the token sampled this step, or empty when the request did
    # not reach the end of its known tokens (a partial prefill chunk).
    sampled_token_ids: list[list[int]]
    logprobs: dict[str, LogprobsLists] = msgspec.field(default_factory=dict)
    # Logprobs of the prompt tokens covered this step (a prefill chunk), per request.
    prompt_logprobs: dict[str, LogprobsLists] = msgspec.field(default_factory=dict)
