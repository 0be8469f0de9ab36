"""`use_beam_search` through a real `core serve` and the openai client: `n` beams come back
as `n` different choices (the algorithm itself is checked against transformers offline,
tests/entrypoints/test_llm_beam_search.py); a chat stream carries them; what beam search
cannot honour is a 400 naming the field."""

from __future__ import annotations

import openai
import pytest
from server_process import ServerProcess
from tiny_engine_checkpoint import write_tiny_checkpoint

pytestmark = pytest.mark.slow

PROMPT = "w1 w2 w3"
BEAMS = {"use_beam_search": True, "ignore_eos": True}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    checkpoint = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    process = ServerProcess(
        str(checkpoint), "--dtype", "float32", "--max-model-len", "32",
        "--kv-cache-memory", "1MiB",
    ).wait_ready()  # fmt: skip
    yield openai.OpenAI(base_url=f"{process.url}/v1", api_key="x", max_retries=0, timeout=60)
    process.stop()


def test_n_beams_are_n_different_choices_best_first(client):
    completion = client.completions.create(
        model=None, prompt=PROMPT, max_tokens=6, n=2, extra_body=BEAMS
    )
    texts = [choice.text for choice in completion.choices]
    assert [choice.index for choice in completion.choices] == [0, 1]
    assert len(set(texts)) == 2 and all(texts)
    assert all(choice.finish_reason == "length" for choice in completion.choices)
    assert completion.usage.completion_tokens == 12


def test_a_chat_stream_carries_every_beam(client):
    stream = client.chat.completions.create(
        model=None, messages=[{"role": "user", "content": PROMPT}], max_tokens=4, n=2,
        stream=True, extra_body=BEAMS,
    )  # fmt: skip
    texts: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert sorted(texts) == [0, 1] and texts[0] != texts[1]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stream": True, "extra_body": BEAMS}, "stream"),
        ({"top_p": 0.5, "extra_body": BEAMS}, "top_p"),
        ({"n": 11, "extra_body": BEAMS}, "n"),  # 22 candidates a step: --max-logprobs is 20
        ({"extra_body": {"length_penalty": 0.5}}, "length_penalty"),
    ],
)
def test_what_beam_search_cannot_honour_is_a_400_naming_it(client, extra, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=None, prompt=PROMPT, max_tokens=4, **extra)
    assert refused.value.body["param"] == param
