"""SamplingMetadata.from_params: which tensors exist, their values, and its input checks."""

import pytest
import torch

from core.sample import SamplingMetadata
from core.sampling_params import SamplingParams

VOCAB = 10


def _build(params, *, outputs=None, prompts=None, generators=None, eos_token_id=None):
    return SamplingMetadata.from_params(
        params,
        output_token_ids=outputs or [[] for _ in params],
        prompt_token_ids=prompts or [[] for _ in params],
        vocab_size=VOCAB,
        generators=generators,
        eos_token_id=eos_token_id,
    )


def test_default_params_leave_every_optional_processor_off():
    metadata = _build([SamplingParams(), SamplingParams()])
    assert metadata.temperature.tolist() == [1.0, 1.0]
    assert (metadata.all_greedy, metadata.all_random) == (False, True)
    off = (
        metadata.top_p,
        metadata.top_k,
        metadata.min_p,
        metadata.presence_penalties,
        metadata.frequency_penalties,
        metadata.repetition_penalties,
        metadata.prompt_token_ids,
        metadata.allowed_token_ids_mask,
        metadata.max_num_logprobs,
    )
    assert all(value is None for value in off)
    assert not (metadata.min_tokens or metadata.logit_bias or metadata.bad_words_token_ids)


def test_greedy_flags():
    assert _build([SamplingParams(temperature=0.0)] * 2).all_greedy
    mixed = _build([SamplingParams(temperature=0.0), SamplingParams()])
    assert (mixed.all_greedy, mixed.all_random) == (False, False)


def test_top_k_disabled_rows_hold_the_vocab_size_and_large_k_is_clamped():
    metadata = _build([SamplingParams(top_k=3), SamplingParams(top_k=-1), SamplingParams(top_k=50)])
    assert metadata.top_k.tolist() == [3, VOCAB, VOCAB]


def test_feature_tensors_hold_neutral_values_for_rows_without_them():
    params = [SamplingParams(top_p=0.5, min_p=0.1, presence_penalty=0.5), SamplingParams()]
    metadata = _build(params)
    assert metadata.top_p.tolist() == [0.5, 1.0]
    assert metadata.min_p.tolist() == pytest.approx([0.1, 0.0])
    assert metadata.presence_penalties.tolist() == [0.5, 0.0]
    assert metadata.frequency_penalties.tolist() == [0.0, 0.0]


def test_repetition_penalty_pads_prompts_with_the_vocab_size():
    params = [SamplingParams(repetition_penalty=1.2), SamplingParams()]
    metadata = _build(params, prompts=[[1, 2, 3], [4]])
    assert metadata.repetition_penalties.tolist() == pytest.approx([1.2, 1.0])
    assert metadata.prompt_token_ids.tolist() == [[1, 2, 3], [4, VOCAB, VOCAB]]


def test_min_tokens_rows_carry_stop_ids_and_eos():
    params = [
        SamplingParams(min_tokens=2, stop_token_ids=[7]),
        SamplingParams(min_tokens=2, ignore_eos=True),
        SamplingParams(stop_token_ids=[7]),
    ]
    assert _build(params, eos_token_id=0).min_tokens == {0: (2, {0, 7})}


def test_allowed_token_ids_mask_is_all_true_for_unrestricted_rows():
    metadata = _build([SamplingParams(allowed_token_ids=[1, 3]), SamplingParams()])
    mask = metadata.allowed_token_ids_mask
    assert mask[0].nonzero().flatten().tolist() == [1, 3]
    assert mask[1].all()


def test_logit_bias_bad_words_and_logprobs_are_collected_per_row():
    params = [
        SamplingParams(logprobs=2),
        SamplingParams(logit_bias={4: 1.5}, bad_words_token_ids=[[1, 2]], logprobs=5),
    ]
    metadata = _build(params)
    assert metadata.logit_bias == {1: {4: 1.5}}
    assert metadata.bad_words_token_ids == {1: [[1, 2]]}
    assert metadata.max_num_logprobs == 5


def test_seeded_rows_need_a_generator():
    with pytest.raises(ValueError, match="^generators must hold a generator for seeded row 1$"):
        _build([SamplingParams(), SamplingParams(seed=3)])
    generator = torch.Generator().manual_seed(3)
    metadata = _build([SamplingParams(), SamplingParams(seed=3)], generators={1: generator})
    assert metadata.generators == {1: generator}


def test_row_count_mismatch_is_rejected():
    with pytest.raises(ValueError, match=r"^output_token_ids must have one row per params \(2\)"):
        SamplingMetadata.from_params(
            [SamplingParams()] * 2,
            output_token_ids=[[]],
            prompt_token_ids=[[], []],
            vocab_size=VOCAB,
        )


def test_inconsistent_penalty_tensors_are_rejected():
    base = _build([SamplingParams()])
    with pytest.raises(ValueError, match="^presence_penalties and frequency_penalties"):
        SamplingMetadata(**{**vars(base), "presence_penalties": torch.zeros(1)})
    with pytest.raises(ValueError, match="^prompt_token_ids must be set"):
        SamplingMetadata(**{**vars(base), "repetition_penalties": torch.ones(1)})
