"""Sampler.process_logits: the logits forward draws from, which speculative decoding verifies."""

import pytest
import torch

from core.sample import DefaultSampler, Sampler, SamplerOutput, SamplingMetadata
from core.sampling_params import SamplingParams


def _metadata(params: list[SamplingParams], **kwargs) -> SamplingMetadata:
    num_rows = len(params)
    kwargs.setdefault("output_token_ids", [[] for _ in range(num_rows)])
    kwargs.setdefault("prompt_token_ids", [[] for _ in range(num_rows)])
    return SamplingMetadata.from_params(params, vocab_size=kwargs.pop("vocab_size"), **kwargs)


class _ForwardOnlySampler(Sampler):
    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        return SamplerOutput(sampled_token_ids=logits.argmax(dim=-1), logprobs=None)


def test_a_sampler_without_it_says_it_cannot_verify_drafts():
    metadata = _metadata([SamplingParams(temperature=0.0)], vocab_size=3)
    with pytest.raises(NotImplementedError, match="^_ForwardOnlySampler cannot verify spec"):
        _ForwardOnlySampler().process_logits(torch.zeros(1, 3), metadata)


def test_penalty_then_temperature_in_the_processed_logits():
    # Presence penalty 1.5 on token 0, then temperature 0.5: [2 - 1.5, 1, -5] / 0.5.
    logits = torch.tensor([[2.0, 1.0, -5.0]])
    params = [SamplingParams(temperature=0.5, presence_penalty=1.5)]
    metadata = _metadata(params, vocab_size=3, output_token_ids=[[0]])
    processed = DefaultSampler().process_logits(logits, metadata)
    assert torch.equal(processed, torch.tensor([[1.0, 2.0, -10.0]]))


def test_random_row_softmax_is_the_truncated_distribution():
    # T = 0.5 squares the probabilities: [0.25, 0.09, 0.04, 0.01, 0.0009] up to a factor;
    # top_k=3 keeps the first three, [0.658, 0.237, 0.105] once renormalized; top_p=0.85
    # then keeps the first two (mass before the third is 0.895 >= 0.85): [0.25, 0.09] / 0.34.
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.1, 0.03]])
    params = [SamplingParams(temperature=0.5, top_k=3, top_p=0.85)]
    processed = DefaultSampler().process_logits(probs.log(), _metadata(params, vocab_size=5))
    expected = torch.tensor([[0.25 / 0.34, 0.09 / 0.34, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(processed.softmax(dim=-1), expected)


@pytest.mark.parametrize("mixed", [False, True], ids=["all-greedy", "beside-random-rows"])
def test_greedy_row_argmax_is_the_token_forward_returns(mixed: bool):
    logits = torch.randn(6, 32, generator=torch.Generator().manual_seed(0)) * 3
    greedy = SamplingParams(
        temperature=0.0, logit_bias={5: 4.0}, repetition_penalty=1.5, top_k=3, min_p=0.2
    )
    random = SamplingParams(temperature=0.9, top_p=0.8, seed=0)
    params = [random if mixed and row % 2 else greedy for row in range(6)]
    # Prompts holding each row's argmax, so the repetition penalty can move it.
    prompts = [[int(logits[row].argmax())] for row in range(6)]
    generators = {row: torch.Generator() for row in range(6) if params[row] is random}
    metadata = _metadata(params, vocab_size=32, prompt_token_ids=prompts, generators=generators)
    sampler = DefaultSampler()
    processed = sampler.process_logits(logits, metadata)
    sampled = sampler(logits, metadata).sampled_token_ids
    rows = slice(0, 6, 2) if mixed else slice(None)
    assert torch.equal(processed.argmax(dim=-1)[rows], sampled[rows])


def test_inputs_are_left_unchanged_and_the_result_is_float32():
    logits = torch.randn(2, 8, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    before = logits.clone()
    params = [SamplingParams(temperature=0.7, top_k=2, presence_penalty=0.5)] * 2
    history = [[1, 2], [3]]
    metadata = _metadata(params, vocab_size=8, output_token_ids=history)
    processed = DefaultSampler().process_logits(logits, metadata)
    assert processed.dtype == torch.float32
    assert torch.equal(logits, before) and history == [[1, 2], [3]]
