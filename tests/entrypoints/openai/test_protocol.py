"""OpenAI request models (strict types, ignored unknown fields, OpenAI's own limits) and the
response builders, checked against the openai client's own response models."""

from __future__ import annotations

import math

import openai.types as oai
import openai.types.chat as oai_chat
import pytest
from pydantic import ValidationError

from core.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
)
from core.entrypoints.openai.responses import (
    chat_choice,
    chat_logprobs,
    chat_stream_choice,
    completion_choice,
    completion_logprobs,
    usage_info,
)
from core.outputs import CompletionOutput, Logprob, RequestOutput

USER = [{"role": "user", "content": "hi"}]


def error_locs(exc: pytest.ExceptionInfo[ValidationError]) -> list[tuple]:
    return [e["loc"] for e in exc.value.errors()]


# --- requests ------------------------------------------------------------------------------


def test_completion_defaults_follow_openai():
    req = CompletionRequest.model_validate({"prompt": "x"})
    assert req.max_tokens == 16
    assert req.stream is False and req.echo is False
    assert req.logprobs is None and req.temperature is None and req.n is None


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [
        ("a b", ["a b"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_prompt_forms_normalize_to_a_batch(prompt, prompts):
    assert CompletionRequest.model_validate({"prompt": prompt}).prompts() == prompts


@pytest.mark.parametrize("prompt", [[], [1, "a"], [[]], [[1], "a"], True, 5, [True], None])
def test_bad_prompt_is_one_error_at_prompt(prompt):
    with pytest.raises(ValidationError) as exc:
        CompletionRequest.model_validate({"prompt": prompt})
    assert error_locs(exc) == [("prompt",)]


def test_unknown_fields_are_ignored():
    req = CompletionRequest.model_validate({"prompt": "x", "best_of": 1, "frobnicate": True})
    assert not hasattr(req, "frobnicate")
    chat = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x", "refusal": None}], "tools": []}
    )
    assert chat.messages[0].content == "x"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", "16"),
        ("max_tokens", 16.0),
        ("n", True),
        ("temperature", "0.5"),
        ("stream", "yes"),
        ("echo", 1),
        ("seed", 1.5),
        ("logprobs", True),
        ("stop", 5),
        ("stop_token_ids", [-1]),
        ("top_k", "3"),
        ("ignore_eos", "false"),
        ("guided_choice", "a"),
    ],
)
def test_wrong_type_is_rejected_at_its_field(field, value):
    with pytest.raises(ValidationError) as exc:
        CompletionRequest.model_validate({"prompt": "x", field: value})
    assert {loc[0] for loc in error_locs(exc)} == {field}


def test_null_optional_flags_mean_their_default():
    req = CompletionRequest.model_validate({"prompt": "x", "stream": None, "echo": None})
    assert not req.stream and not req.echo
    assert not ChatCompletionRequest.model_validate({"messages": USER, "logprobs": None}).logprobs


def test_int_is_accepted_where_a_float_is_expected():
    req = CompletionRequest.model_validate({"prompt": "x", "temperature": 1, "top_p": 1})
    assert req.temperature == 1.0 and isinstance(req.temperature, float)


def test_logit_bias_value_must_be_a_number():
    with pytest.raises(ValidationError) as exc:
        CompletionRequest.model_validate({"prompt": "x", "logit_bias": {"5": "high"}})
    assert error_locs(exc)[0][0] == "logit_bias"


@pytest.mark.parametrize("logprobs", [-1, 21])
def test_completion_logprobs_must_be_in_0_to_20(logprobs):
    with pytest.raises(ValidationError) as exc:
        CompletionRequest.model_validate({"prompt": "x", "logprobs": logprobs})
    assert error_locs(exc) == [("logprobs",)]
    assert CompletionRequest.model_validate({"prompt": "x", "logprobs": 20}).logprobs == 20


def test_suffix_is_rejected_as_unsupported():
    with pytest.raises(ValidationError, match="suffix is not supported") as exc:
        CompletionRequest.model_validate({"prompt": "x", "suffix": "end"})
    assert error_locs(exc) == [("suffix",)]


def test_stream_options_need_stream():
    with pytest.raises(ValidationError, match="only allowed when stream is true") as exc:
        CompletionRequest.model_validate({"prompt": "x", "stream_options": {"include_usage": True}})
    assert error_locs(exc) == [("stream_options",)]
    req = CompletionRequest.model_validate(
        {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    )
    assert req.stream_options.include_usage is True


def test_chat_conversation_keeps_content_parts_with_developer_as_system():
    req = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
                    "name": "ann",
                },
                {"role": "assistant", "content": None},
                {"role": "tool", "content": "42", "tool_call_id": "call_1"},
            ]
        }
    )
    assert req.conversation() == [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
            "name": "ann",
        },
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]
    assert req.add_generation_prompt is True and req.continue_final_message is False


def test_image_parts_are_taken_as_openai_and_vllm_send_them():
    parts = [
        {"type": "image_url", "image_url": {"url": "http://x/y.png", "detail": "low"}},
        {"type": "image_url", "image_url": "http://x/z.png"},  # vLLM: the URL itself
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
    ]
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": parts}]})
    assert req.conversation()[0]["content"] == [
        {"type": "image_url", "image_url": {"url": "http://x/y.png", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "http://x/z.png"}},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
    ]


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"type": "image_embeds", "image_embeds": "AAAA"}, "image_embeds is not supported"),
        ({"type": "input_audio", "input_audio": {}}, "content part type 'input_audio' is not"),
        ({"type": "image_pil", "image_pil": "x"}, "content part type 'image_pil' is not"),
        ({"text": "no type"}, "content part type None is not supported"),
    ],
)
def test_a_part_of_another_type_is_rejected_naming_its_type_at_its_own_path(part, message):
    messages = [{"role": "user", "content": [{"type": "text", "text": "see"}, part]}]
    with pytest.raises(ValidationError, match=message) as exc:
        ChatCompletionRequest.model_validate({"messages": messages})
    assert error_locs(exc) == [("messages", 0, "content", "Parts", 1, "RefusedContentPart")]


@pytest.mark.parametrize(
    ("messages", "loc"),
    [
        ([], ("messages",)),
        ([{"role": "", "content": "x"}], ("messages", 0, "role")),  # any other role is taken
        ([{"role": "user"}], ("messages", 0)),
        ([{"role": "user", "content": 3}], ("messages", 0, "content")),
    ],
)
def test_bad_messages_are_rejected_at_their_path(messages, loc):
    with pytest.raises(ValidationError) as exc:
        ChatCompletionRequest.model_validate({"messages": messages})
    assert error_locs(exc)[0][: len(loc)] == loc


@pytest.mark.parametrize("top", [-1, 21])
def test_top_logprobs_must_be_in_0_to_20(top):
    with pytest.raises(ValidationError) as exc:
        ChatCompletionRequest.model_validate(
            {"messages": USER, "logprobs": True, "top_logprobs": top}
        )
    assert error_locs(exc) == [("top_logprobs",)]


def test_top_logprobs_need_logprobs():
    with pytest.raises(ValidationError, match="needs logprobs") as exc:
        ChatCompletionRequest.model_validate({"messages": USER, "top_logprobs": 2})
    assert error_locs(exc) == [("top_logprobs",)]


def test_response_format_json_schema_reads_schema_key():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = ChatCompletionRequest.model_validate(
        {
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "thing", "schema": schema, "strict": True},
            },
        }
    )
    assert req.response_format.json_schema.schema_ == schema
    assert req.response_format.json_schema.name == "thing"


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema"},
        {"type": "json_object", "json_schema": {"name": "x", "schema": {}}},
        {"type": "xml"},
        {"type": "json_schema", "json_schema": {"schema": {}}},
    ],
)
def test_bad_response_format_is_rejected(response_format):
    with pytest.raises(ValidationError) as exc:
        ChatCompletionRequest.model_validate({"messages": USER, "response_format": response_format})
    assert error_locs(exc)[0][0] == "response_format"


def test_continue_final_message_rules():
    assistant_last = [*USER, {"role": "assistant", "content": "Hel"}]
    with pytest.raises(ValidationError, match="cannot both be true"):
        ChatCompletionRequest.model_validate(
            {"messages": assistant_last, "continue_final_message": True}
        )
    with pytest.raises(ValidationError, match="last message to be the assistant's"):
        ChatCompletionRequest.model_validate(
            {"messages": USER, "continue_final_message": True, "add_generation_prompt": False}
        )
    req = ChatCompletionRequest.model_validate(
        {
            "messages": assistant_last,
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
    )
    assert req.conversation()[-1] == {"role": "assistant", "content": "Hel"}


def test_tokenize_takes_prompt_or_messages_with_their_special_token_default():
    assert TokenizeRequest.model_validate({"prompt": "x"}).add_special_tokens is True
    chat = TokenizeRequest.model_validate({"messages": USER})
    assert chat.add_special_tokens is False
    assert chat.conversation() == USER
    explicit = TokenizeRequest.model_validate({"prompt": "x", "add_special_tokens": False})
    assert explicit.add_special_tokens is False
    for body in ({}, {"prompt": "x", "messages": USER}):
        with pytest.raises(ValidationError, match="exactly one of prompt and messages"):
            TokenizeRequest.model_validate(body)


def test_detokenize_rejects_negative_token_ids():
    assert DetokenizeRequest.model_validate({"tokens": [0, 5]}).tokens == [0, 5]
    with pytest.raises(ValidationError) as exc:
        DetokenizeRequest.model_validate({"tokens": [1, -2]})
    assert error_locs(exc) == [("tokens", 1)]


# --- responses -----------------------------------------------------------------------------

TOKENS = {1: "<s>", 7: "Hello", 8: " world", 9: "!", 10: "\u00e9"}


def decode(token_id: int) -> str:
    return TOKENS[token_id]


def output(index=0, logprobs=None, finish_reason="stop", stop_reason=None) -> CompletionOutput:
    return CompletionOutput(
        index=index,
        text="Hello world",
        token_ids=[7, 8],
        cumulative_logprob=None,
        logprobs=logprobs,
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )


def request_output(outputs, prompt_ids=(1, 2, 3), prompt_logprobs=None) -> RequestOutput:
    return RequestOutput(
        request_id="r",
        prompt="Say",
        prompt_token_ids=list(prompt_ids),
        prompt_logprobs=prompt_logprobs,
        outputs=outputs,
        finished=True,
    )


# Position 0: sampled 7 (rank 1), top-2 are 7 and 9. Position 1: sampled 8 at rank 3
# (outside the top-2 of 9 and 10); 10's logprob is -inf and its decoded text is missing.
POSITIONS = [
    {7: Logprob(-0.5, 1, "Hello"), 9: Logprob(-1.5, 2, "!")},
    {8: Logprob(-2.0, 3, " world"), 9: Logprob(-0.25, 1, "!"), 10: Logprob(-math.inf, 2, None)},
]


def test_completion_logprobs_list_chosen_and_top_tokens_with_offsets():
    lp = completion_logprobs([7, 8], POSITIONS, decode, initial_text_offset=3)
    assert lp.tokens == ["Hello", " world"]
    assert lp.token_logprobs == [-0.5, -2.0]
    assert lp.text_offset == [3, 8]
    assert lp.top_logprobs == [
        {"Hello": -0.5, "!": -1.5},
        {" world": -2.0, "!": -0.25, "\u00e9": -9999.0},
    ]


def test_chat_logprobs_keep_the_top_n_by_rank_with_utf8_bytes():
    lp = chat_logprobs([7, 8], POSITIONS, 2, decode)
    first, second = lp.content
    assert (first.token, first.logprob, first.bytes) == ("Hello", -0.5, list(b"Hello"))
    assert [(t.token, t.logprob) for t in first.top_logprobs] == [("Hello", -0.5), ("!", -1.5)]
    assert (second.token, second.logprob) == (" world", -2.0)
    assert [(t.token, t.logprob) for t in second.top_logprobs] == [("!", -0.25), ("é", -9999.0)]
    assert second.top_logprobs[1].bytes == [0xC3, 0xA9]
    one = chat_logprobs([7, 8], POSITIONS, 1, decode)
    assert [[t.token for t in c.top_logprobs] for c in one.content] == [["Hello"], ["!"]]
    assert [c.top_logprobs for c in chat_logprobs([7, 8], POSITIONS, 0, decode).content] == [
        [],
        [],
    ]


def test_usage_counts_each_prompt_once_and_every_sample():
    first = request_output([output(0), output(1)])
    second = request_output([output(0)], prompt_ids=(4, 5))
    usage = usage_info([first, second])
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (5, 6, 11)
    assert usage_info(first).model_dump(exclude_none=True) == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
    }


def test_completion_response_parses_as_an_openai_completion():
    ro = request_output([output(0, POSITIONS), output(1, POSITIONS, "length")])
    response = CompletionResponse(
        model="m",
        choices=[completion_choice(ro, o, decode, index=2 + o.index) for o in ro.outputs],
        usage=usage_info(ro),
    )
    parsed = oai.Completion.model_validate(response.model_dump())
    assert parsed.object == "text_completion" and parsed.id.startswith("cmpl-")
    assert [c.index for c in parsed.choices] == [2, 3]
    assert [c.finish_reason for c in parsed.choices] == ["stop", "length"]
    assert parsed.choices[0].logprobs.tokens == ["Hello", " world"]
    assert parsed.usage.total_tokens == 7


def test_completion_echo_prepends_the_prompt_and_its_logprobs():
    prompt_positions = [None, {2: Logprob(-1.0, 1, "Say")}, {3: Logprob(-3.0, 4, "!")}]
    ro = request_output([output(0, POSITIONS)], prompt_logprobs=prompt_positions)
    choice = completion_choice(ro, ro.outputs[0], decode, echo_text="<s>Say!")
    assert choice.text == "<s>Say!Hello world"
    assert choice.logprobs.tokens == ["<s>", "Say", "!", "Hello", " world"]
    assert choice.logprobs.token_logprobs == [None, -1.0, -3.0, -0.5, -2.0]
    assert choice.logprobs.text_offset == [0, 3, 6, 7, 12]
    assert choice.logprobs.top_logprobs[0] is None


def test_completion_choice_without_logprobs_passes_stop_reason_through():
    ro = request_output([output(0, None, "stop", stop_reason="\n\n")])
    choice = completion_choice(ro, ro.outputs[0], decode)
    assert (choice.text, choice.logprobs, choice.stop_reason) == ("Hello world", None, "\n\n")
    token_stop = completion_choice(ro, output(0, None, "stop", 2), decode)
    assert token_stop.stop_reason == 2


def test_chat_response_parses_as_an_openai_chat_completion():
    ro = request_output([output(0, POSITIONS)])
    response = ChatCompletionResponse(
        model="m", choices=[chat_choice(o, decode, 2) for o in ro.outputs], usage=usage_info(ro)
    )
    parsed = oai_chat.ChatCompletion.model_validate(response.model_dump())
    assert parsed.object == "chat.completion" and parsed.id.startswith("chatcmpl-")
    message = parsed.choices[0].message
    assert (message.role, message.content) == ("assistant", "Hello world")
    assert [t.token for t in parsed.choices[0].logprobs.content] == ["Hello", " world"]
    assert parsed.choices[0].logprobs.content[1].top_logprobs[0].token == "!"


def test_chat_stream_chunk_parses_as_an_openai_chunk():
    chunk = ChatCompletionStreamResponse(
        model="m", choices=[chat_stream_choice(output(0, None, None), decode, role="assistant")]
    )
    parsed = oai_chat.ChatCompletionChunk.model_validate(chunk.model_dump())
    assert parsed.object == "chat.completion.chunk"
    assert (parsed.choices[0].delta.role, parsed.choices[0].delta.content) == (
        "assistant",
        "Hello world",
    )
    assert parsed.choices[0].finish_reason is None and parsed.usage is None


def test_model_list_entries_parse_as_openai_models_and_carry_max_model_len():
    listing = ModelList(data=[ModelCard(id="SmolLM2-135M-Instruct", max_model_len=2048)])
    dumped = listing.model_dump()
    assert dumped["object"] == "list"
    model = oai.Model.model_validate(dumped["data"][0])
    assert (model.id, model.object) == ("SmolLM2-135M-Instruct", "model")
    assert dumped["data"][0]["max_model_len"] == 2048
