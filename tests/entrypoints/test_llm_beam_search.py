"""LLM.beam_search on the tiny random-weight llama in float32, against transformers' beam
search of the same model.

The two are compared where both algorithms are defined alike: no beam ends at EOS
(ignore_eos here, no eos_token_id for transformers), so every beam runs max_tokens tokens,
all lengths are equal and both rank beams by cumulative logprob (length_penalty cannot
reorder equal lengths; early_stopping only concerns finished hypotheses). transformers'
top candidates over every (beam, token) pair are then among each beam's 2 * beam_width
candidates that core asks the engine for, and the kept beams are the same.
"""

from __future__ import annotations

import pytest
import torch
from tiny_engine_checkpoint import engine_kwargs, reference_model, write_tiny_checkpoint

from core import LLM, SamplingParams
from core.beam_search import BeamSearchParams

PROMPTS = [[3, 4, 5, 6], [7, 8, 9]]
BEAM_WIDTH, MAX_TOKENS = 3, 6


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    return LLM(**engine_kwargs(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))))


def transformers_beams(prompt: list[int], length_penalty: float) -> list[list[int]]:
    with torch.no_grad():
        sequences = reference_model().generate(
            torch.tensor([prompt]), num_beams=BEAM_WIDTH, num_return_sequences=BEAM_WIDTH,
            do_sample=False, max_new_tokens=MAX_TOKENS, length_penalty=length_penalty,
            early_stopping=False, eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    return sequences[:, len(prompt) :].tolist()


def test_every_beam_equals_transformers_beam_search_in_order(llm):
    params = BeamSearchParams(
        beam_width=BEAM_WIDTH, max_tokens=MAX_TOKENS, ignore_eos=True, length_penalty=0.5
    )
    prompts = [{"prompt_token_ids": PROMPTS[0]}, "w5 w6 w7"]
    found = llm.beam_search(prompts, params)
    text_ids = llm.get_tokenizer().encode("w5 w6 w7")
    for prompt, output in zip([PROMPTS[0], text_ids], found, strict=True):
        ours = [beam.tokens[len(prompt) :] for beam in output.sequences]
        assert ours == transformers_beams(prompt, length_penalty=0.5)
        scores = [beam.cum_logprob for beam in output.sequences]
        assert scores == sorted(scores, reverse=True)
        assert all(beam.tokens[: len(prompt)] == prompt for beam in output.sequences)
    assert found[1].sequences[0].text.startswith("w5 w6 w7")


def test_beam_width_one_is_greedy_generation(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    generated = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    found = llm.beam_search(PROMPTS, BeamSearchParams(1, MAX_TOKENS, ignore_eos=True))
    assert [
        o.sequences[0].tokens[len(p) :] for p, o in zip(PROMPTS, found, strict=True)
    ] == generated


def test_each_step_finds_its_beams_prefix_in_the_prefix_cache(llm, monkeypatch):
    run = llm._run
    cached: list[list[int]] = []

    def counted(prepared, *args, **kwargs):
        outputs = run(prepared, *args, **kwargs)
        cached.append([output.num_cached_tokens for output in outputs])
        return outputs

    monkeypatch.setattr(llm, "_run", counted)
    prompt = list(range(3, 23))  # 20 tokens: a full 16-token block to share
    llm.beam_search([prompt], BeamSearchParams(2, 4, ignore_eos=True))
    assert len(cached) == 4
    assert all(count >= 16 for step in cached[1:] for count in step)


@pytest.mark.parametrize(
    ("prompt", "params", "named"),
    [
        ([3] * 30, BeamSearchParams(2, 8), "max_tokens"),  # 38 tokens: past max_model_len 32
        ([3, 4], BeamSearchParams(11, 2), "beam_width"),  # 22 candidates: max_logprobs 20
        ([60], BeamSearchParams(2, 2), "prompt"),  # outside the vocabulary
        ({"prompt": "w1", "multi_modal_data": {"image": []}}, BeamSearchParams(2, 2), "multi"),
    ],
)
def test_a_bad_prompt_or_params_is_a_value_error_naming_the_field(llm, prompt, params, named):
    with pytest.raises(ValueError, match=f"^{named}"):
        llm.beam_search([prompt], params)
    assert not llm.engine.has_unfinished_requests()
