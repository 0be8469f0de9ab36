"""What the runner's output holds, whichever path made it: every request of the batch in batch
order with the tokens it emitted (none for a partial prefill chunk or an empty step), and
with speculation the n + 1 tokens a verification of n drafts may emit and the next drafts.

The model is a counter (its greedy next token is the current one + 1), so the tokens and
drafts a step must emit are known without a reference run.
"""

from __future__ import annotations

import torch
from torch import nn

from core.kv_cache.layout import KVCacheConfig
from core.sample.sampler import DefaultSampler
from core.sampling_params import SamplingParams
from core.spec_decode.interface import ProposalBatch, Proposer
from core.spec_decode.rejection_sampler import StandardRejectionSampler
from core.worker.contract import CachedRequestData, NewRequestData, SchedulerOutput
from core.worker.model_runner import ModelRunner
from core.worker.speculator import Speculator

VOCAB = 32
K = 2


class CountingModel(nn.Module):
    """The next token after t is t + 1, at every position."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot((input_ids + 1) % VOCAB, VOCAB).float()  # [T, V]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden  # [N, V]


class CountingProposer(Proposer):
    """Drafts the k tokens counting on from each row's last one: what the model emits."""

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        last = [int(batch.token_ids[r, batch.num_tokens[r] - 1]) for r in batch.propose_rows]
        return [[t + i for i in range(1, batch.num_speculative_tokens + 1)] for t in last]


def make_runner(speculate: bool = False) -> ModelRunner:
    speculator = None
    if speculate:
        speculator = Speculator(CountingProposer(None, None), StandardRejectionSampler(), K)
    runner = ModelRunner(
        model=CountingModel(), sampler=DefaultSampler(), device=torch.device("cpu"),
        max_num_reqs=4, max_model_len=32, max_num_batched_tokens=16, vocab_size=VOCAB,
        eos_token_id=None, speculator=speculator,
    )  # fmt: skip
    # The counter has no attention layers: no KV-cache groups, no metadata builders.
    runner.initialize_kv_cache(KVCacheConfig(0, (), ()), [])
    return runner


def new(req_id: str, prompt: list[int]) -> NewRequestData:
    params = SamplingParams(temperature=0.0, max_tokens=16)
    return NewRequestData(
        req_id=req_id, prompt_token_ids=prompt, sampling_params=params, block_ids=(),
        num_computed_tokens=0,
    )  # fmt: skip


def first_step(*requests: tuple[str, list[int], int]) -> SchedulerOutput:
    """New requests (id, prompt, tokens scheduled)."""
    return SchedulerOutput(
        scheduled_new_reqs=[new(req_id, prompt) for req_id, prompt, _ in requests],
        num_scheduled_tokens={req_id: count for req_id, _, count in requests},
        total_num_scheduled_tokens=sum(count for *_, count in requests),
    )


def verify_step(req_id: str, num_computed: int, drafts: list[int]) -> SchedulerOutput:
    """A known request's new token and its drafts."""
    cached = CachedRequestData(
        req_ids=[req_id], resumed_from_preemption=[False], new_block_ids=[None],
        num_computed_tokens=[num_computed],
    )  # fmt: skip
    count = 1 + len(drafts)
    return SchedulerOutput(
        scheduled_cached_reqs=cached,
        num_scheduled_tokens={req_id: count},
        total_num_scheduled_tokens=count,
        scheduled_spec_decode_tokens={req_id: drafts},
    )


def test_every_request_is_listed_in_batch_order_with_a_partial_chunk_emitting_nothing():
    output = make_runner().execute_model(first_step(("a", [1, 2, 3], 3), ("b", [5, 6, 7, 8], 2)))
    assert output.req_ids == ["a", "b"]
    assert output.sampled_token_ids == [[4], []]
    assert output.spec_token_ids is None


def test_a_step_with_nothing_scheduled_lists_no_request():
    runner = make_runner()
    runner.execute_model(first_step(("a", [1, 2, 3], 3)))
    output = runner.execute_model(SchedulerOutput(finished_req_ids={"a"}))
    assert (output.req_ids, output.sampled_token_ids) == ([], [])


def test_verifying_n_accepted_drafts_emits_n_plus_one_tokens_and_the_next_drafts():
    runner = make_runner(speculate=True)
    first = runner.execute_model(first_step(("a", [1, 2, 3], 3), ("b", [9, 9, 9, 9], 2)))
    assert first.sampled_token_ids == [[4], []]
    assert first.spec_token_ids == [[5, 6], []]  # a partial chunk drafts nothing
    output = runner.execute_model(verify_step("a", 3, [5, 6]))
    assert (output.req_ids, output.sampled_token_ids) == (["a"], [[5, 6, 7]])
    assert output.spec_token_ids == [[8, 9]]


def test_a_rejected_draft_ends_the_emitted_tokens_with_the_targets_own():
    runner = make_runner(speculate=True)
    runner.execute_model(first_step(("a", [1, 2, 3], 3)))
    output = runner.execute_model(verify_step("a", 3, [5, 9]))
    assert output.sampled_token_ids == [[5, 6]]  # 5 accepted, 9 rejected: the target says 6
    assert output.spec_token_ids == [[7, 8]]
