"""The Responses API on a real `core serve` of the default model, through the official
openai client (one server for the module, with the hermes tool template so that function
tools reach the prompt). Outputs are greedy and short; what the Responses API answers is
compared with what /v1/chat/completions answers for the same conversation.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
TEMPLATE = Path(__file__).parents[2] / "data" / "tool_chat_template_hermes.jinja"
INSTRUCTIONS = "Answer in one short sentence."
QUESTION = "What is the capital of France?"
STORY = "Write a long story about a dragon."
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 32}},
    "required": ["city"],
}


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("--chat-template", str(TEMPLATE)).wait_ready()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def chat_answer(client):
    """The greedy chat completion of INSTRUCTIONS and QUESTION (8 tokens at most)."""
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
    return client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=8
    )


def aborted_requests(server) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:request_success_total"
        and sample.labels["finished_reason"] == "abort"
    )


def test_string_input_with_instructions_answers_as_chat_completions(client, chat_answer):
    response = client.responses.create(
        model=MODEL, input=QUESTION, instructions=INSTRUCTIONS, temperature=0, max_output_tokens=8
    )
    assert response.output_text == chat_answer.choices[0].message.content
    assert response.model == MODEL and response.temperature == 0
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens) == (
        chat_answer.usage.prompt_tokens,
        chat_answer.usage.completion_tokens,
    )
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_streamed_message_items_add_up_to_the_chat_answer(client, chat_answer):
    question = [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]
    stream = client.responses.create(
        model=MODEL, input=question, instructions=INSTRUCTIONS, temperature=0,
        max_output_tokens=8, stream=True,
    )  # fmt: skip
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == chat_answer.choices[0].message.content == events[-4].text
    final = events[-1].response
    assert final.output_text == text
    assert final.usage.output_tokens == chat_answer.usage.completion_tokens
    stopped_early = chat_answer.choices[0].finish_reason == "stop"
    assert final.status == ("completed" if stopped_early else "incomplete")
    assert kinds[-1] == f"response.{final.status}"
    stored = client.responses.retrieve(final.id)
    assert (stored.status, stored.output_text) == (final.status, text)


def test_max_output_tokens_makes_the_response_incomplete(client):
    response = client.responses.create(model=MODEL, input=STORY, temperature=0, max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3 and response.max_output_tokens == 3


def test_previous_response_id_continues_the_conversation(server, client):
    first_turn = "My name is Ada. Say hello to me."
    first = client.responses.create(
        model=MODEL, input=first_turn, temperature=0, max_output_tokens=6
    )
    second = client.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id,
        temperature=0, max_output_tokens=1,
    )  # fmt: skip
    conversation = [
        {"role": "user", "content": first_turn},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    prompt = httpx.post(f"{server.url}/tokenize", json={"messages": conversation}).json()
    assert second.usage.input_tokens == prompt["count"]
    assert second.previous_response_id == first.id


def test_unstored_and_unknown_responses_are_404(client):
    unstored = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
    assert unstored.status in ("completed", "incomplete")
    for response_id in (unstored.id, "resp_unknown"):
        with pytest.raises(openai.NotFoundError, match=f"Response with id '{response_id}'"):
            client.responses.retrieve(response_id)


def test_cancelling_a_background_response_aborts_it_in_the_engine(server, client):
    aborted = aborted_requests(server)
    response = client.responses.create(
        model=MODEL, input=STORY, temperature=0, max_output_tokens=256, background=True
    )
    assert response.status == "in_progress"
    cancelled = client.responses.cancel(response.id)
    assert cancelled.status == "cancelled"
    assert cancelled.usage.output_tokens < 256
    assert client.responses.retrieve(response.id).status == "cancelled"
    deadline = time.monotonic() + 30  # the frontend counts the abort as it sends it
    while aborted_requests(server) == aborted and time.monotonic() < deadline:
        time.sleep(0.1)
    assert aborted_requests(server) == aborted + 1


def test_required_tool_choice_calls_the_function_with_valid_arguments(client):
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS}
    response = client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[tool],
        tool_choice="required", parallel_tool_calls=False, temperature=0, max_output_tokens=88,
    )  # fmt: skip
    (call,) = response.output
    assert (call.type, call.name, response.status) == ("function_call", "get_weather", "completed")
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)


def test_a_hosted_tool_is_refused_naming_its_type(client):
    with pytest.raises(openai.BadRequestError, match="tool type 'web_search_preview'"):
        client.responses.create(model=MODEL, input="Hi", tools=[{"type": "web_search_preview"}])
