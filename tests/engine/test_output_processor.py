"""OutputProcessor on hand-made engine-core outputs whose token ids are real SmolLM2 encodings
of known texts: final texts against the tokenizer's decode, stop strings, streaming deltas,
n > 1 aggregation, logprobs, abort and metrics."""

from __future__ import annotations

import queue
import random

import pytest
from engine_output_helpers import (
    ARRIVAL_TIME,
    load_smollm_tokenizer,
    make_request,
    step,
    stream_tokens,
)

from core.engine.output_processor import OutputProcessor, RequestOutputKind
from core.engine.protocol import EngineCoreOutput, EngineCoreOutputs, FinishReason
from core.outputs import Logprob
from core.tokenizer import Tokenizer
from core.worker.contract import LogprobsLists

DELTA = RequestOutputKind.DELTA
CUMULATIVE = RequestOutputKind.CUMULATIVE
SENTENCE = "The cat sat on the mat. Then it slept."
PROMPT_IDS = [504, 2644]


@pytest.fixture(scope="module")
def smollm() -> Tokenizer:
    return load_smollm_tokenizer()


@pytest.fixture
def processor(smollm) -> OutputProcessor:
    return OutputProcessor(smollm)


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _outputs(results) -> list:
    return [output for result in results for output in result.request_outputs]


def test_final_text_equals_decode_of_the_output_ids(processor, smollm):
    ids = _ids(smollm, "Hello 😀 world 日本語 🎉🎉 ok")
    processor.add_request(make_request("r", PROMPT_IDS, max_tokens=50), prompt="The cat")
    results = stream_tokens(processor, "r", ids)
    assert _outputs(results[:-1]) == []  # FINAL_ONLY: nothing before the end
    (output,) = results[-1].request_outputs
    assert (output.request_id, output.prompt, output.prompt_token_ids) == (
        "r",
        "The cat",
        PROMPT_IDS,
    )
    assert output.finished and output.prompt_logprobs is None
    (completion,) = output.outputs
    assert completion.text == smollm.decode(ids) and completion.token_ids == ids
    assert (completion.finish_reason, completion.stop_reason) == ("length", None)
    assert completion.cumulative_logprob is None and completion.logprobs is None
    assert not processor.has_unfinished_requests()


def test_delta_and_cumulative_outputs_build_the_same_text(processor, smollm):
    ids = _ids(smollm, "Hi 😀, 你好 " + SENTENCE)
    processor.add_request(make_request("d", PROMPT_IDS, max_tokens=50), output_kind=DELTA)
    processor.add_request(make_request("c", PROMPT_IDS, max_tokens=50), output_kind=CUMULATIVE)
    deltas = _outputs(stream_tokens(processor, "d", ids))
    cumulative = _outputs(stream_tokens(processor, "c", ids))
    assert len(deltas) == len(cumulative) == len(ids)  # one output per step with a token
    assert [o.outputs[0].token_ids for o in deltas] == [[i] for i in ids]
    assert "".join(o.outputs[0].text for o in deltas) == smollm.decode(ids)
    texts = [o.outputs[0].text for o in cumulative]
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False))
    assert texts[-1] == smollm.decode(ids) and cumulative[-1].outputs[0].token_ids == ids
    assert [o.finished for o in deltas] == [False] * (len(ids) - 1) + [True]


@pytest.mark.parametrize(
    ("include", "expected"),
    [(False, "The cat sat on the "), (True, "The cat sat on the mat. Then")],
)
def test_stop_string_spanning_tokens_cuts_the_text_and_asks_for_an_abort(
    processor, smollm, include, expected
):
    ids = _ids(smollm, SENTENCE)
    request = make_request("r", PROMPT_IDS, stop=["mat. Then"], include_stop_str_in_output=include)
    processor.add_request(request)
    results = stream_tokens(processor, "r", ids, finish_reason=None)
    # ' mat' '.' ' Then': the eighth token completes the stop string.
    assert [r.reqs_to_abort for r in results] == [[]] * 7 + [["r"]] + [[]] * 3
    (output,) = _outputs(results)
    completion = output.outputs[0]
    assert completion.text == expected
    assert completion.token_ids == ids[:8]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", "mat. Then")
    assert not processor.has_unfinished_requests()


@pytest.mark.parametrize(("include", "expected"), [(False, ""), (True, "STOP")])
def test_stop_string_at_the_very_start(processor, smollm, include, expected):
    processor.add_request(
        make_request("r", PROMPT_IDS, stop=["STOP"], include_stop_str_in_output=include)
    )
    result = processor.process_outputs(
        step(EngineCoreOutput(request_id="r", new_token_ids=_ids(smollm, "STOP here")))
    )
    assert result.reqs_to_abort == ["r"]
    completion = result.request_outputs[0].outputs[0]
    assert (completion.text, completion.token_ids) == (expected, _ids(smollm, "STOP"))


def _reference_cut(text: str, checkable_from: int, stop: list[str], include: bool) -> str:
    """The text up to the first character at which a stop string ends after `checkable_from`
    (the longest one when several end there), by brute force over every end position."""
    for end in range(checkable_from + 1, len(text) + 1):
        ending = [s for s in stop if text[:end].endswith(s)]
        if ending:
            longest = max(ending, key=len)
            return text[:end] if include else text[: end - len(longest)]
    return text


STREAM_CASES = [
    ("I said the end is near", ["the end"]),
    ("the enemy of the end", ["the end", "enemy"]),
    ("the enemy of the end", ["the end", "of the"]),
    ("aaa bbb aaa ccc", ["a c", "bb a"]),
    ("Hi 😀 there 😀!", ["😀!", "e 😀"]),
    ("nothing stops here", ["zzz", "here!"]),
]


@pytest.mark.parametrize(("text", "stop"), STREAM_CASES)
@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("min_tokens", [0, 2])
def test_streamed_deltas_never_release_text_a_stop_string_later_cuts(
    processor, smollm, text, stop, include, min_tokens
):
    ids = _ids(smollm, text)
    params = dict(stop=stop, include_stop_str_in_output=include, min_tokens=min_tokens)
    processor.add_request(make_request("r", PROMPT_IDS, **params), output_kind=DELTA)
    shown = _released_texts(stream_tokens(processor, "r", ids))
    checkable_from = len(smollm.decode(ids[:min_tokens]))
    final = _reference_cut(text, checkable_from, stop, include)
    assert shown[-1] == final
    # Every text shown on the way is a prefix of the final one: no prefix of the stop string
    # that cut it was ever released.
    assert all(final.startswith(released) for released in shown)


def _released_texts(results) -> list[str]:
    """The text released so far after each DELTA output."""
    released, shown = "", []
    for output in _outputs(results):
        released += output.outputs[0].text
        shown.append(released)
    return shown


def test_min_tokens_delays_the_stop_string_check(processor, smollm):
    ids = _ids(smollm, "the enemy of the end")  # 'the' ' enemy' ' of' ' the' ' end'
    for request_id, min_tokens in (("early", 0), ("late", 1), ("later", 5)):
        processor.add_request(
            make_request(request_id, PROMPT_IDS, stop=["the"], min_tokens=min_tokens)
        )
    texts = {}
    for request_id in ("early", "late", "later"):
        (output,) = _outputs(stream_tokens(processor, request_id, ids))
        texts[request_id] = output.outputs[0].text
    assert texts == {"early": "", "late": "the enemy of ", "later": "the enemy of the end"}


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_skip_special_tokens(processor, smollm, skip_special_tokens):
    ids = _ids(smollm, "<|im_start|>assistant\nHi<|im_end|><|im_start|>")
    request = make_request("r", PROMPT_IDS, skip_special_tokens=skip_special_tokens)
    processor.add_request(request)
    (output,) = _outputs(stream_tokens(processor, "r", ids))
    assert output.outputs[0].text == smollm.decode(ids, skip_special_tokens=skip_special_tokens)
    assert ("<|im_start|>" in output.outputs[0].text) is not skip_special_tokens


@pytest.mark.parametrize(
    ("text", "stop_reason", "include", "expected"),
    [
        ("Hi there<|im_end|>", None, False, "Hi there"),  # EOS
        ("Hi there<|im_end|>", None, True, "Hi there<|im_end|>"),
        ("Hi there.", 30, False, "Hi there"),  # stop_token_ids=[30] ('.')
        ("Hi there.", 30, True, "Hi there."),
    ],
)
def test_stop_token_text_is_left_out_unless_included(
    processor, smollm, text, stop_reason, include, expected
):
    ids = _ids(smollm, text)
    params = dict(skip_special_tokens=False, include_stop_str_in_output=include)
    processor.add_request(make_request("r", PROMPT_IDS, **params))
    results = stream_tokens(processor, "r", ids, FinishReason.STOP, stop_reason)
    completion = results[-1].request_outputs[0].outputs[0]
    assert (completion.text, completion.token_ids) == (expected, ids)
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop_reason)
    assert results[-1].reqs_to_abort == []  # the engine core finished it itself


def test_tokens_after_the_one_completing_a_stop_string_are_dropped(processor, smollm):
    ids = _ids(smollm, SENTENCE)
    processor.add_request(make_request("r", PROMPT_IDS, stop=["sat"], logprobs=0))
    lists = LogprobsLists(
        logprob_token_ids=[[i] for i in ids], logprobs=[[-1.0]] * len(ids), ranks=[1] * len(ids)
    )
    output = EngineCoreOutput(request_id="r", new_token_ids=ids, new_logprobs=lists)
    result = processor.process_outputs(step(output))
    completion = result.request_outputs[0].outputs[0]
    assert completion.token_ids == ids[:3] and len(completion.logprobs) == 3
    assert completion.cumulative_logprob == -3.0 and completion.text == "The cat "


def test_n_samples_run_as_children_and_come_back_as_one_output(processor, smollm):
    children = processor.add_request(make_request("r", PROMPT_IDS, n=2, seed=7))
    assert [c.request_id for c in children] == ["0_r", "1_r"]
    assert [(c.sampling_params.n, c.sampling_params.seed) for c in children] == [(1, 7), (1, 8)]
    assert all(c.prompt_token_ids == PROMPT_IDS for c in children)
    hello, world = _ids(smollm, "Hello"), _ids(smollm, " world")
    first = processor.process_outputs(
        step(
            EngineCoreOutput(
                request_id="0_r", new_token_ids=hello, finish_reason=FinishReason.LENGTH
            ),
            EngineCoreOutput(request_id="1_r", new_token_ids=world),
        )
    )
    assert first.request_outputs == []  # FINAL_ONLY waits for every sample
    last = processor.process_outputs(
        step(
            EngineCoreOutput(
                request_id="1_r", new_token_ids=hello, finish_reason=FinishReason.LENGTH
            )
        )
    )
    (output,) = last.request_outputs
    assert output.request_id == "r" and output.finished
    assert [(c.index, c.text) for c in output.outputs] == [(0, "Hello"), (1, " worldHello")]


def test_n_samples_stream_deltas_of_the_samples_that_moved(processor, smollm):
    processor.add_request(make_request("r", PROMPT_IDS, n=2, stop=["cat"]), output_kind=DELTA)
    the, cat, sat = _ids(smollm, "The cat sat")
    both = processor.process_outputs(
        step(
            EngineCoreOutput(request_id="0_r", new_token_ids=[the]),
            EngineCoreOutput(request_id="1_r", new_token_ids=[sat]),
        )
    )
    (output,) = both.request_outputs
    # len("cat") - 1 = 2 characters stay held back while a sample runs.
    texts = [(c.index, c.token_ids, c.text) for c in output.outputs]
    assert texts == [(0, [the], "T"), (1, [sat], " s")]
    stopped = processor.process_outputs(
        step(EngineCoreOutput(request_id="0_r", new_token_ids=[cat]))
    )
    assert stopped.reqs_to_abort == ["0_r"]  # only that sample; the other one runs on
    (output,) = stopped.request_outputs
    assert not output.finished
    assert [(c.index, c.text, c.finish_reason) for c in output.outputs] == [(0, "he ", "stop")]
    late = processor.process_outputs(
        step(
            EngineCoreOutput(request_id="0_r", new_token_ids=[sat]),  # in flight: ignored
            EngineCoreOutput(
                request_id="1_r", new_token_ids=[the], finish_reason=FinishReason.LENGTH
            ),
        )
    )
    (output,) = late.request_outputs
    assert output.finished
    assert [(c.index, c.text, c.finish_reason) for c in output.outputs] == [(1, "atThe", "length")]
    assert not processor.has_unfinished_requests()


@pytest.mark.parametrize(("seed", "expected"), [(None, [None, None]), (2**64 - 1, [2**64 - 1, 0])])
def test_child_seeds_differ_and_stay_in_range(processor, seed, expected):
    children = processor.add_request(make_request("r", PROMPT_IDS, n=2, seed=seed))
    assert [c.sampling_params.seed for c in children] == expected


def test_logprobs_become_position_dicts_and_sum_into_cumulative_logprob(processor, smollm):
    hello, world, there = _ids(smollm, "Hello world there")
    processor.add_request(make_request("r", PROMPT_IDS, logprobs=2), output_kind=DELTA)
    lists = LogprobsLists(
        # position 0: chosen 'Hello' is also the best; position 1: chosen ' there' is 7th.
        logprob_token_ids=[[hello, hello, world], [there, world, hello]],
        logprobs=[[-0.5, -0.5, -1.5], [-3.0, -0.25, -0.75]],
        ranks=[1, 7],
    )
    result = processor.process_outputs(
        step(EngineCoreOutput(request_id="r", new_token_ids=[hello, there], new_logprobs=lists))
    )
    completion = result.request_outputs[0].outputs[0]
    assert completion.logprobs == [
        {hello: Logprob(-0.5, 1, "Hello"), world: Logprob(-1.5, 2, " world")},
        {
            there: Logprob(-3.0, 7, " there"),
            world: Logprob(-0.25, 1, " world"),
            hello: Logprob(-0.75, 2, "Hello"),
        },
    ]
    assert list(completion.logprobs[1]) == [there, world, hello]  # the chosen token first
    assert completion.cumulative_logprob == -3.5


def test_prompt_logprobs_start_with_none_and_stream_once(processor, smollm):
    prompt = _ids(smollm, "The cat sat")
    processor.add_request(make_request("r", prompt, prompt_logprobs=0), output_kind=DELTA)
    lists = LogprobsLists(
        logprob_token_ids=[[prompt[1]], [prompt[2]]], logprobs=[[-2.0], [-4.0]], ranks=[3, 9]
    )
    first = processor.process_outputs(
        step(EngineCoreOutput(request_id="r", new_token_ids=[30], new_prompt_logprobs=lists))
    )
    assert first.request_outputs[0].prompt_logprobs == [
        None,
        {prompt[1]: Logprob(-2.0, 3, " cat")},
        {prompt[2]: Logprob(-4.0, 9, " sat")},
    ]
    second = processor.process_outputs(step(EngineCoreOutput(request_id="r", new_token_ids=[30])))
    assert second.request_outputs[0].prompt_logprobs is None


def test_mismatched_logprobs_are_a_clear_error(processor, smollm):
    processor.add_request(make_request("r", PROMPT_IDS, logprobs=0))
    lists = LogprobsLists(logprob_token_ids=[[30]], logprobs=[[-1.0]], ranks=[1])
    bad = EngineCoreOutput(request_id="r", new_token_ids=[30, 30], new_logprobs=lists)
    with pytest.raises(ValueError, match="1 logprob positions for 2 new tokens"):
        processor.process_outputs(step(bad))


def test_abort_returns_engine_ids_and_ends_the_waiting_queue(processor, smollm):
    waiting: queue.Queue = queue.Queue()
    processor.add_request(make_request("q", PROMPT_IDS, n=2), output_kind=DELTA, queue=waiting)
    processor.add_request(make_request("plain", PROMPT_IDS))
    hello = _ids(smollm, "Hello")
    result = processor.process_outputs(
        step(EngineCoreOutput(request_id="0_q", new_token_ids=hello))
    )
    assert result.request_outputs == []  # it went to the queue
    assert waiting.get_nowait().outputs[0].text == "Hello"
    assert processor.abort_requests(["q", "unknown"]) == ["0_q", "1_q"]
    final = waiting.get_nowait()
    assert final.finished and [(c.index, c.finish_reason) for c in final.outputs] == [
        (0, "abort"),
        (1, "abort"),
    ]
    later = processor.process_outputs(step(EngineCoreOutput(request_id="1_q", new_token_ids=hello)))
    assert later.request_outputs == [] and waiting.empty()
    assert processor.has_unfinished_requests()  # "plain" still runs
    assert processor.abort_requests(["plain"]) == ["plain"]
    assert not processor.has_unfinished_requests()


def test_requests_the_engine_finished_on_its_own_end_as_aborted(processor, smollm):
    processor.add_request(make_request("r", PROMPT_IDS))
    processor.process_outputs(step(EngineCoreOutput(request_id="r", new_token_ids=[19556])))
    result = processor.process_outputs(EngineCoreOutputs(finished_requests={"r"}))
    (output,) = result.request_outputs
    assert output.outputs[0].text == "Hello" and output.outputs[0].finish_reason == "abort"
    assert not processor.has_unfinished_requests()


def test_metrics_record_arrival_first_token_and_finish(processor, smollm, monkeypatch):
    clock = iter([1001.0, 1002.0, 1003.0])
    monkeypatch.setattr("core.engine.output_processor.time.time", lambda: next(clock))
    processor.add_request(make_request("r", PROMPT_IDS), output_kind=CUMULATIVE)
    outputs = _outputs(stream_tokens(processor, "r", _ids(smollm, "The cat sat")))
    first, last = outputs[0].metrics, outputs[-1].metrics
    assert (first.arrival_time, first.first_token_time, first.finished_time) == (
        ARRIVAL_TIME,
        1001.0,
        None,
    )
    assert (last.first_token_time, last.last_token_time, last.finished_time) == (
        1001.0,
        1003.0,
        1003.0,
    )


def test_bad_requests_are_rejected(processor):
    processor.add_request(make_request("r", PROMPT_IDS, n=2))
    with pytest.raises(ValueError, match="request_id 'r' is already in use"):
        processor.add_request(make_request("r", PROMPT_IDS))
    with pytest.raises(ValueError, match="request_id '0_r' is already in use"):
        processor.add_request(make_request("0_r", PROMPT_IDS))
    with pytest.raises(ValueError, match="detokenize=True needs a tokenizer"):
        OutputProcessor(None).add_request(make_request("x", PROMPT_IDS))


def test_without_a_tokenizer_outputs_carry_ids_only():
    processor = OutputProcessor(None)
    processor.add_request(make_request("r", PROMPT_IDS, detokenize=False, logprobs=0))
    lists = LogprobsLists(logprob_token_ids=[[30]], logprobs=[[-1.0]], ranks=[1])
    output = EngineCoreOutput(
        request_id="r", new_token_ids=[30], new_logprobs=lists, finish_reason=FinishReason.LENGTH
    )
    completion = processor.process_outputs(step(output)).request_outputs[0].outputs[0]
    assert (completion.text, completion.token_ids) == ("", [30])
    assert completion.logprobs == [{30: Logprob(-1.0, 1, None)}]


def test_random_streams_match_the_brute_force_stop_reference(processor, smollm):
    rng = random.Random(1)
    words = ["the", " end", " cat", "😀", " 日本", " sat", "!", " on"]
    for trial in range(40):
        text = "".join(rng.choice(words) for _ in range(12))
        stop = [rng.choice(words).strip() + rng.choice(words) for _ in range(2)]
        request_id = f"t{trial}"
        processor.add_request(make_request(request_id, PROMPT_IDS, stop=stop), output_kind=DELTA)
        shown = _released_texts(stream_tokens(processor, request_id, _ids(smollm, text)))
        final = _reference_cut(text, 0, stop, include=False)
        assert shown[-1] == final, (text, stop)
        assert all(final.startswith(s) for s in shown), (text, stop)


def test_a_cut_final_character_is_flushed_into_the_final_text(processor, smollm):
    ids = _ids(smollm, "Hi 😀")[:-1]  # the emoji's last byte never came
    processor.add_request(make_request("r", PROMPT_IDS), output_kind=DELTA)
    outputs = _outputs(stream_tokens(processor, "r", ids))
    assert [o.outputs[0].text for o in outputs] == ["Hi", " \ufffd"]
    assert smollm.decode(ids) == "Hi \ufffd"


def test_stop_string_in_the_engines_last_output_needs_no_abort(processor, smollm):
    ids = _ids(smollm, "The cat sat")
    processor.add_request(make_request("r", PROMPT_IDS, stop=["sat"]))
    results = stream_tokens(processor, "r", ids, FinishReason.LENGTH)
    assert [r.reqs_to_abort for r in results] == [[], [], []]
    completion = results[-1].request_outputs[0].outputs[0]
    assert (completion.text, completion.finish_reason, completion.stop_reason) == (
        "The cat ",
        "stop",
        "sat",
    )
