"""The offline API on the default model: outputs, n, seeds, stop strings, bad input."""

from __future__ import annotations

import pytest

from core import LLM, SamplingParams
from core.engine.output_processor import RequestOutputKind

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(kv_cache_memory="256MiB", max_model_len=512)


def test_chat_answers_the_capital_of_france(llm):
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}], GREEDY)
    assert "Paris" in out[0].outputs[0].text


def test_outputs_come_back_in_prompt_order_with_vllm_fields(llm):
    prompts = ["The sky is", [1, 2, 3, 4], {"prompt": "Once upon a time"}]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outputs] == ["The sky is", None, "Once upon a time"]
    assert outputs[1].prompt_token_ids == [1, 2, 3, 4]
    for output in outputs:
        completion = output.outputs[0]
        assert output.finished and completion.finish_reason in ("stop", "length")
        assert len(completion.token_ids) <= 16
        assert output.metrics.first_token_time is not None


def test_detokenized_text_equals_decoding_the_ids(llm):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for output in llm.generate(["Write an emoji story: 🐍🚀", "中文的句子"], params, False):
        completion = output.outputs[0]
        decoded = llm.get_tokenizer().decode(completion.token_ids, skip_special_tokens=True)
        assert completion.text == decoded


def test_n_samples_with_a_seed_are_reproducible(llm):
    params = SamplingParams(n=4, temperature=1.0, seed=1234, max_tokens=12)
    first = llm.generate("Tell me a story", params, use_tqdm=False)[0]
    again = llm.generate("Tell me a story", params, use_tqdm=False)[0]
    assert len(first.outputs) == 4
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]
    assert len({tuple(c.token_ids) for c in first.outputs}) > 1  # the samples differ


def test_stop_strings_cut_exactly_and_never_leak_in_streamed_deltas(llm):
    free = llm.generate("Count: 1, 2, 3,", SamplingParams(temperature=0.0, max_tokens=24),
                        use_tqdm=False)[0].outputs[0].text  # fmt: skip
    stop = free[len(free) // 2 : len(free) // 2 + 3]
    cut = free[: free.index(stop)]
    params = SamplingParams(temperature=0.0, max_tokens=24, stop=[stop])
    out = llm.generate("Count: 1, 2, 3,", params, use_tqdm=False)[0].outputs[0]
    assert (out.text, out.finish_reason, out.stop_reason) == (cut, "stop", stop)

    engine = llm.engine
    engine.add_request("stream", "Count: 1, 2, 3,", params, RequestOutputKind.DELTA)
    streamed = ""
    while engine.has_unfinished_requests():
        for output in engine.step():
            streamed += output.outputs[0].text
            # Nothing of the stop string's match is ever released, not even its start.
            assert cut.startswith(streamed)
    assert streamed == cut


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ("", GREEDY, "prompt: The decoder prompt cannot be empty"),
        ("word " * 600, GREEDY, "max_model_len"),
        ([10**7], GREEDY, "Token id 10000000 is out of vocabulary"),
        ("hi", {"logprobs": 10**6}, "logprobs"),
    ],
)
def test_bad_input_raises_and_the_engine_keeps_serving(llm, prompt, params, message):
    if isinstance(params, dict):
        params = SamplingParams(**params)
    with pytest.raises(ValueError, match=message):
        llm.generate(["fine prompt", prompt], params, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()  # nothing half-queued
    assert llm.generate("Still serving?", GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_invalid_sampling_parameter_names_the_field():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)


def test_n_samples_share_the_prompt_blocks(llm):
    stats = llm.engine.core.kv.prefix_cache_stats
    hits_before = stats.hits
    prompt = "The quick brown fox jumps over the lazy dog. " * 8  # > 4 full blocks
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=4)
    output = llm.generate(prompt, params, use_tqdm=False)[0]
    num_prompt = len(output.prompt_token_ids)
    full_blocks = (num_prompt - 1) // 16 * 16
    # Children admitted after the first find its prompt blocks in the cache.
    assert stats.hits - hits_before >= 3 * full_blocks
    assert output.num_cached_tokens == 0  # sample 0 computed the prompt itself


def test_abort_frees_the_request(llm):
    engine = llm.engine
    engine.add_request("to-abort", "Tell me a long story", SamplingParams(max_tokens=200))
    engine.step()
    assert engine.core.kv.usage > 0
    engine.abort_request(["to-abort"])
    assert not engine.has_unfinished_requests()
    engine.core.step()  # tells the worker; nothing is left running
    assert engine.core.kv.usage == 0


def test_engine_refuses_a_kv_budget_smaller_than_one_request():
    with pytest.raises(ValueError, match="raise --kv-cache-memory or lower --max-model-len"):
        LLM(kv_cache_memory="1MiB", max_model_len=2048)
