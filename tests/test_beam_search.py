"""core.beam_search over a scripted step: candidates with hand-picked logprobs, so each
ranking below is worked out by hand with vLLM's score, cum_logprob / len ** length_penalty,
len counting the prompt and the generated tokens but not a final EOS."""

from __future__ import annotations

import math

import pytest

from core.beam_search import BeamSearchParams, beam_search, check_beam_width, request_output
from core.engine.core_client import run_inline
from core.outputs import CompletionOutput, Logprob, RequestOutput

EOS = 0
PROMPT = [9]

# The next-token logprobs after each sequence (prompt included); any other sequence gets
# LATER. After [9]: EOS at once scores ln(0.5) / 1 (the prompt alone), token 1 ln(0.3) / 2.
TABLE = {
    (9,): {EOS: math.log(0.5), 1: math.log(0.3), 2: math.log(0.2)},
    (9, 1): {1: math.log(0.9), EOS: math.log(0.1)},
    (9, 2): {1: math.log(0.6), EOS: math.log(0.4)},
}
LATER = {1: math.log(0.9), EOS: math.log(0.1)}


def scripted_step(calls: list[list[list[int]]] | None = None):
    async def step(beams, params):
        assert params.max_tokens == 1 and params.logprobs is not None
        if calls is not None:
            calls.append([tokens for _, tokens in beams])
        return [_output(TABLE.get(tuple(tokens), LATER)) for _, tokens in beams]

    return step


def _output(candidates: dict[int, float]) -> RequestOutput:
    logprobs = {token: Logprob(lp) for token, lp in candidates.items()}
    chosen = max(candidates, key=candidates.get)
    completion = CompletionOutput(0, "", [chosen], candidates[chosen], [logprobs], "length")
    return RequestOutput("step", None, [], None, [completion], True)


def search(params: BeamSearchParams, step=None):
    [found] = run_inline(beam_search([PROMPT], params, step or scripted_step(), EOS))
    return found.sequences


def test_a_short_finished_beam_wins_with_no_length_penalty_and_loses_with_a_strong_one():
    # length_penalty 0: raw cum_logprob. [9, EOS] ln .5 = -0.69 beats [9, 1, 1] ln .27.
    short_first = search(BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=0.0))
    assert [s.tokens for s in short_first] == [[9], [9, 1, 1]]
    assert short_first[0].finish_reason == "stop" and short_first[0].stop_reason == EOS
    assert short_first[1].finish_reason == "length"
    # length_penalty 2: [9, 1, 1] ln .27 / 9 = -0.145 and [9, 2, 1] ln .12 / 9 = -0.236
    # beat [9, 2, EOS] ln .08 / 4 = -0.63 and [9, EOS] ln .5 / 1 = -0.69.
    long_first = search(BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=2.0))
    assert [s.tokens for s in long_first] == [[9, 1, 1], [9, 2, 1]]


def test_a_finished_beam_keeps_its_eos_only_when_asked():
    params = BeamSearchParams(
        beam_width=2, max_tokens=2, length_penalty=0.0, include_stop_str_in_output=True
    )
    assert search(params)[0].tokens == [9, EOS]


def test_ignore_eos_extends_through_eos_and_ranks_by_cum_logprob():
    # Without EOS ending a beam, the best two of step 1 are [9, EOS] and [9, 1]; after
    # [9, EOS] comes LATER: [9, EOS, 1] is ln .45 against [9, 1, 1] ln .27.
    params = BeamSearchParams(beam_width=2, max_tokens=2, ignore_eos=True)
    found = search(params)
    assert [s.tokens for s in found] == [[9, EOS, 1], [9, 1, 1]]
    assert found[0].cum_logprob == pytest.approx(math.log(0.45))


def test_each_step_runs_the_live_beams_whole():
    calls: list[list[list[int]]] = []
    search(BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=0.0), scripted_step(calls))
    # EOS finished [9, EOS] at step 1: only [9, 1] and [9, 2] went on.
    assert calls == [[[9]], [[9, 1], [9, 2]]]


def test_an_aborted_step_ends_the_search_with_abort():
    async def aborted(beams, params):
        empty = CompletionOutput(0, "", [], None, None, "abort")
        return [RequestOutput("step", None, [], None, [empty], True) for _ in beams]

    [beam] = search(BeamSearchParams(beam_width=1, max_tokens=3), aborted)
    assert beam.tokens == PROMPT and beam.finish_reason == "abort"


def test_request_output_answers_the_generated_tokens_best_first_without_eos_text():
    params = BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=0.0)
    [found] = run_inline(beam_search([PROMPT], params, scripted_step(), EOS))
    words = {EOS: "</s>", 1: "a", 9: "p"}
    output = request_output("r", "p", PROMPT, found, lambda ids: "".join(words[i] for i in ids))
    assert [(c.index, c.token_ids, c.text) for c in output.outputs] == [
        (0, [], ""),
        (1, [1, 1], "aa"),
    ]
    assert output.finished and output.prompt_token_ids == PROMPT


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"beam_width": 0, "max_tokens": 4}, "beam_width"),
        ({"beam_width": 2, "max_tokens": 0}, "max_tokens"),
        ({"beam_width": 2, "max_tokens": 4, "temperature": -1.0}, "temperature"),
        ({"beam_width": 2, "max_tokens": 4, "length_penalty": math.inf}, "length_penalty"),
    ],
)
def test_bad_params_are_a_value_error_naming_the_field(fields, named):
    with pytest.raises(ValueError, match=f"^{named}"):
        BeamSearchParams(**fields)


def test_a_beam_width_needing_more_logprobs_than_the_engine_gives_is_refused():
    check_beam_width(BeamSearchParams(beam_width=10, max_tokens=1), 20)
    check_beam_width(BeamSearchParams(beam_width=50, max_tokens=1), -1)  # -1: no cap
    with pytest.raises(ValueError, match="^beam_width 11 needs 22"):
        check_beam_width(BeamSearchParams(beam_width=11, max_tokens=1), 20)
