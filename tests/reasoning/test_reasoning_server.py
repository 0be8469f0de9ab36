"""A reasoning model behind `core serve --reasoning-parser deepseek_r1`, through the openai
client: `reasoning_content` apart from `content`, the same streamed and not, and a JSON
schema that constrains only the answer after `</think>`; the Responses API's reasoning item
and message hold the same texts. Offline without the parser, the same schema constrains
the output from its first token.

The model (reasoning_checkpoint) writes REASONING, `</think>`, then ANSWER whenever nothing
masks it, so what the grammar changed is plain to see.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from reasoning_checkpoint import (
    ANSWER,
    REASONING,
    reasoning_tokenizer,
    write_reasoning_checkpoint,
)
from server_process import ServerProcess

from core import LLM, SamplingParams
from core.sampling_params import StructuredOutputsParams

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_reasoning_checkpoint(tmp_path_factory.mktemp("reasoning"))


@pytest.fixture(scope="module")
def client(checkpoint):
    server = ServerProcess(str(checkpoint), "--reasoning-parser", "deepseek_r1").wait_ready()
    yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    server.stop()


def whole(client, **extra) -> tuple[str | None, str | None]:
    reply = client.chat.completions.create(
        model=None, messages=QUESTION, temperature=0, max_tokens=64, **extra
    )
    message = reply.choices[0].message
    return message.reasoning_content, message.content


def streamed(client, **extra) -> tuple[list[str], list[str]]:
    """The reasoning pieces and the content pieces of a stream, in order."""
    chunks = client.chat.completions.create(
        model=None, messages=QUESTION, temperature=0, max_tokens=64, stream=True, **extra
    )
    reasoning, content = [], []
    for chunk in chunks:
        delta = chunk.choices[0].delta
        if getattr(delta, "reasoning_content", None):
            assert not content, "reasoning after content"
            reasoning.append(delta.reasoning_content)
        if delta.content:
            content.append(delta.content)
    return reasoning, content


def test_reasoning_and_content_are_split_the_same_streamed_and_not(client):
    assert whole(client) == (REASONING, ANSWER)
    reasoning, content = streamed(client)
    assert ("".join(reasoning), "".join(content)) == (REASONING, ANSWER)
    assert len(reasoning) > 1  # the reasoning streamed as it came, not at its end


def test_a_json_schema_constrains_only_what_follows_the_reasoning(client):
    reasoning, content = whole(client, response_format=JSON_SCHEMA_FORMAT)
    assert reasoning == REASONING  # free text, which the schema would not have allowed
    jsonschema.validate(json.loads(content), SCHEMA)
    pieces = streamed(client, response_format=JSON_SCHEMA_FORMAT)
    assert ("".join(pieces[0]), "".join(pieces[1])) == (reasoning, content)


def test_responses_have_a_reasoning_item_with_chats_reasoning_streamed_and_not(client):
    reasoning, content = whole(client)
    request = {"input": QUESTION, "temperature": 0, "max_output_tokens": 64}
    response = client.responses.create(**request)
    thought, message = response.output
    assert (thought.type, message.type) == ("reasoning", "message")
    assert (thought.content[0].text, response.output_text) == (reasoning, content)
    num_reasoning_tokens = len(reasoning_tokenizer().encode(REASONING, add_special_tokens=False))
    assert response.usage.output_tokens_details.reasoning_tokens == num_reasoning_tokens
    events = list(client.responses.create(stream=True, **request))
    thoughts = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    answers = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert ("".join(thoughts), "".join(answers)) == (reasoning, content)
    ignored = {"id": True, "created_at": True, "output": {"__all__": {"id"}}}
    streamed = events[-1].response
    assert streamed.model_dump(exclude=ignored) == response.model_dump(exclude=ignored)


def test_without_a_reasoning_parser_the_schema_constrains_from_the_first_token(checkpoint):
    llm = LLM(str(checkpoint), dtype="float32", max_model_len=256, kv_cache_memory="64MiB")
    constrained = SamplingParams(
        temperature=0, max_tokens=64, skip_special_tokens=False,
        structured_outputs=StructuredOutputsParams(json=SCHEMA),
    )  # fmt: skip
    free = SamplingParams(temperature=0, max_tokens=64, skip_special_tokens=False)
    free_text, constrained_text = (
        llm.chat(QUESTION, params, use_tqdm=False)[0].outputs[0].text
        for params in (free, constrained)
    )
    assert free_text == f"{REASONING}</think>{ANSWER}"  # what the model writes unmasked
    jsonschema.validate(json.loads(constrained_text), SCHEMA)  # no reasoning, no </think>
