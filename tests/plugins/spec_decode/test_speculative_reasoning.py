"""N-gram speculation on a reasoning model whose output is JSON-schema'd after `</think>`:
drafts that cross the end of the reasoning are free up to it and checked by the grammar
after it, and the output is the same as without drafts.

The model (reasoning_checkpoint) follows its chain of tokens whatever the prompt, so a
prompt holding its own output makes the n-gram proposer draft that output, across
`</think>`; the target accepts drafts on both sides of it.
"""

from __future__ import annotations

import pytest
from reasoning_checkpoint import write_reasoning_checkpoint

from core import LLM, SamplingParams
from core.sampling_params import StructuredOutputsParams

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
}
NGRAM = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 2}


def test_drafts_across_the_end_of_the_reasoning_keep_the_output(tmp_path):
    model_dir = write_reasoning_checkpoint(tmp_path)
    settings = dict(dtype="float32", max_model_len=256, reasoning_parser="deepseek_r1")
    params = SamplingParams(
        temperature=0, max_tokens=64, skip_special_tokens=False,
        structured_outputs=StructuredOutputsParams(json=SCHEMA),
    )  # fmt: skip
    plain = LLM(str(model_dir), **settings)
    tokenizer = plain.get_tokenizer()
    encode = tokenizer.backend_tokenizer.encode

    def prompt(said: list[int]) -> list[int]:
        before = encode("<|im_start|>user\nSay: ", add_special_tokens=False).ids
        after = encode("<|im_end|>\n<|im_start|>assistant\n<think>\n", add_special_tokens=False)
        return [*before, *said, *after.ids]

    def output_ids(llm: LLM, prompt_ids: list[int]) -> list[int]:
        (output,) = llm.generate(prompt_ids, params, use_tqdm=False)
        assert output.outputs[0].finish_reason == "stop"
        return output.outputs[0].token_ids

    reference = output_ids(plain, prompt([]))
    end = reference.index(tokenizer.backend_tokenizer.token_to_id("</think>"))
    assert 0 < end < len(reference) - 2  # reasoning, the end, then the JSON answer
    echoing = prompt(reference)
    assert output_ids(plain, echoing) == reference
    del plain
    speculative = LLM(str(model_dir), speculative_config=NGRAM, **settings)
    assert output_ids(speculative, echoing) == reference
    stats = speculative.engine.core.scheduler.make_stats().spec_decoding
    # More accepted drafts than positions up to the end: some came after it, grammar-checked.
    assert stats.num_accepted_tokens > end + 1
