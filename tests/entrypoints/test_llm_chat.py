"""LLM.chat renders through the InputProcessor (on the tiny model's hand-written vocabulary):
the options reach the template, and a conversation too long for the context names messages."""

from __future__ import annotations

import pytest
from tiny_engine_checkpoint import MAX_MODEL_LEN, VOCAB, engine_kwargs, write_tiny_checkpoint

from core import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=2)


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    return LLM(**engine_kwargs(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))))


def ids(*tokens: str) -> list[int]:
    return [VOCAB[token] for token in tokens]


def test_chat_renders_each_conversation_with_the_generation_prompt(llm):
    conversations = [[{"role": "user", "content": "w1"}], [{"role": "user", "content": "w2"}]]
    outputs = llm.chat(conversations, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == [
        ids("user", ":", "w1", "</s>", "assistant", ":"),
        ids("user", ":", "w2", "</s>", "assistant", ":"),
    ]


def test_chat_continues_the_final_assistant_message(llm):
    messages = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w5 w6"}]
    output = llm.chat(
        messages,
        GREEDY,
        use_tqdm=False,
        add_generation_prompt=False,
        continue_final_message=True,
    )[0]
    assert output.prompt_token_ids == ids("user", ":", "w1", "</s>", "assistant", ":", "w5", "w6")


def test_a_conversation_that_fills_the_context_is_refused_and_serving_goes_on(llm):
    # "user : w1 ... </s> assistant :" is 5 tokens around the words: fill the context exactly.
    long = [{"role": "user", "content": " ".join(["w1"] * (MAX_MODEL_LEN - 5))}]
    with pytest.raises(ValueError, match=f"^prompt is {MAX_MODEL_LEN} tokens long"):
        llm.chat(long, GREEDY, use_tqdm=False)
    fits = [{"role": "user", "content": " ".join(["w1"] * (MAX_MODEL_LEN - 6))}]
    output = llm.chat(fits, SamplingParams(temperature=0.0, max_tokens=None), use_tqdm=False)[0]
    assert len(output.prompt_token_ids) == MAX_MODEL_LEN - 1
    assert len(output.outputs[0].token_ids) == 1
