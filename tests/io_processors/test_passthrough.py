"""core's reference IO processor, `passthrough`: its answers are what generate and embed
give the same prompts, under either runner."""

from __future__ import annotations

from tiny_embedders import write_llama_embedder
from tiny_engine_checkpoint import engine_kwargs, write_tiny_checkpoint

from core import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
PROMPTS = ["w1 w2", [7, 8, 9]]


def test_under_generate_each_prompt_gets_its_first_samples_text_ids_and_reason(tmp_path):
    llm = LLM(**engine_kwargs(write_tiny_checkpoint(tmp_path), io_processor_plugin="passthrough"))
    (answer,) = llm.encode({"data": PROMPTS}, GREEDY, use_tqdm=False)
    samples = [o.outputs[0] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert answer.outputs == [
        {"text": s.text, "token_ids": s.token_ids, "finish_reason": "length"} for s in samples
    ]
    (one,) = llm.encode({"data": "w1 w2"}, GREEDY, use_tqdm=False)
    assert one.outputs == answer.outputs[:1]


def test_under_pooling_each_prompt_gets_its_vector(tmp_path):
    write_llama_embedder(tmp_path)
    llm = LLM(**engine_kwargs(tmp_path, io_processor_plugin="passthrough"))
    (answer,) = llm.encode({"data": PROMPTS}, use_tqdm=False)
    vectors = [o.outputs.embedding for o in llm.embed(PROMPTS, use_tqdm=False)]
    assert answer.outputs == [{"embedding": vector} for vector in vectors]
