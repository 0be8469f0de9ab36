"""OpenAI request -> SamplingParams: every field, length rules, defaults precedence,
structured outputs, and errors that name the request's own field."""

from __future__ import annotations

import pytest

from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.params import (
    chat_sampling_params,
    completion_sampling_params,
    field_error,
)
from core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from core.sampling_params import SamplingParams, StructuredOutputsParams

USER = [{"role": "user", "content": "hi"}]
MAX_MODEL_LEN = 100


def completion(defaults=None, prompt_len=10, **fields) -> SamplingParams:
    req = CompletionRequest.model_validate({"prompt": "x", **fields})
    return completion_sampling_params(req, MAX_MODEL_LEN, prompt_len, defaults)


def chat(defaults=None, prompt_len=10, **fields) -> SamplingParams:
    req = ChatCompletionRequest.model_validate({"messages": USER, **fields})
    return chat_sampling_params(req, MAX_MODEL_LEN, prompt_len, defaults)


def raised(build, **fields) -> OpenAIError:
    with pytest.raises(OpenAIError) as exc:
        build(**fields)
    assert exc.value.status == 400 and exc.value.type == "invalid_request_error"
    return exc.value


@pytest.mark.parametrize("build", [completion, chat])
@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("n", 3, 3),
        ("temperature", 0.3, 0.3),
        ("top_p", 0.9, 0.9),
        ("stop", "END", ["END"]),
        ("stop", ["a", "b"], ["a", "b"]),
        ("presence_penalty", 0.5, 0.5),
        ("frequency_penalty", -0.5, -0.5),
        ("seed", 1234, 1234),
        ("top_k", 40, 40),
        ("min_p", 0.05, 0.05),
        ("repetition_penalty", 1.2, 1.2),
        ("ignore_eos", True, True),
        ("min_tokens", 4, 4),
        ("skip_special_tokens", False, False),
        ("spaces_between_special_tokens", False, False),
        ("include_stop_str_in_output", True, True),
        ("stop_token_ids", [2, 3], [2, 3]),
        ("allowed_token_ids", [5, 6], [5, 6]),
        ("bad_words", ["darn"], ["darn"]),
        ("logit_bias", {"5": 2.5, "17": -200}, {5: 2.5, 17: -100.0}),
    ],
)
def test_field_maps_to_sampling_params(build, field, value, expected):
    assert getattr(build(**{field: value}), field) == expected


@pytest.mark.parametrize("build", [completion, chat])
def test_unset_fields_keep_sampling_params_defaults(build):
    params = build()
    reference = SamplingParams()
    for field in ("n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed"):
        assert getattr(params, field) == getattr(reference, field)
    assert params.logprobs is None and params.structured_outputs is None
    assert params.logit_bias is None and params.prompt_logprobs is None


@pytest.mark.parametrize("build", [completion, chat])
def test_model_defaults_fill_only_unset_fields(build):
    defaults = {"temperature": 0.7, "top_k": 20, "repetition_penalty": 1.1}
    params = build(defaults, temperature=0.2, top_k=None)
    # Set by the request: 0.2; explicit null counts as unset: 20; absent: 1.1.
    assert (params.temperature, params.top_k, params.repetition_penalty) == (0.2, 20, 1.1)


# --- max_tokens ----------------------------------------------------------------------------


def test_completion_max_tokens_default_explicit_and_null():
    assert completion().max_tokens == 16
    assert completion(max_tokens=50).max_tokens == 50
    assert completion(max_tokens=None).max_tokens == MAX_MODEL_LEN - 10


def test_completion_default_max_tokens_is_capped_to_the_room_left():
    assert completion(prompt_len=95).max_tokens == 5
    assert completion({"max_tokens": 200}, prompt_len=40).max_tokens == 60


def test_model_default_max_tokens_applies_only_when_unset():
    assert completion({"max_tokens": 30}).max_tokens == 30
    assert completion({"max_tokens": 30}, max_tokens=5).max_tokens == 5
    assert chat({"max_tokens": 30}).max_tokens == 30
    assert chat({"max_tokens": 30}, max_completion_tokens=7).max_tokens == 7


def test_explicit_max_tokens_beyond_the_context_is_an_error():
    error = raised(completion, prompt_len=95, max_tokens=6)
    assert error.param == "max_tokens"
    assert error.message == (
        "max_tokens is 6, but the prompt is 95 tokens and max_model_len is 100: "
        "at most 5 tokens can be generated"
    )
    assert completion(prompt_len=95, max_tokens=5).max_tokens == 5


def test_chat_max_completion_tokens_wins_over_max_tokens():
    assert chat(max_tokens=20, max_completion_tokens=30).max_tokens == 30
    assert chat(max_tokens=20).max_tokens == 20
    assert chat().max_tokens == MAX_MODEL_LEN - 10
    assert raised(chat, prompt_len=90, max_completion_tokens=11).param == "max_completion_tokens"


@pytest.mark.parametrize(("build", "field"), [(completion, "prompt"), (chat, "messages")])
def test_prompt_that_fills_the_context_is_an_error_naming_it(build, field):
    error = raised(build, prompt_len=MAX_MODEL_LEN)
    assert error.param == field
    assert error.message.startswith(
        f"{field} is 100 tokens long, which leaves no room to generate under max_model_len 100"
    )


@pytest.mark.parametrize("build", [completion, chat])
def test_a_prompt_one_short_of_the_context_leaves_exactly_one_token(build):
    assert build(prompt_len=MAX_MODEL_LEN - 1).max_tokens == 1
    assert build(prompt_len=MAX_MODEL_LEN - 1, max_tokens=1).max_tokens == 1
    assert raised(build, prompt_len=MAX_MODEL_LEN - 1, max_tokens=2).param == "max_tokens"


def test_engine_value_errors_become_400s_naming_the_request_field():
    long = field_error("prompt is 40 tokens long, which leaves no room", {"prompt": "messages"})
    assert (long.status, long.param) == (400, "messages")
    assert long.message == "messages is 40 tokens long, which leaves no room"
    logprobs = field_error("logprobs must be <= max_logprobs (20), got 30", {"prompt": "prompt"})
    assert logprobs.param == "logprobs"
    unnamed = field_error("invalid structured_outputs.regex: (", {"prompt": "prompt"})
    assert unnamed.param is None and unnamed.message == "invalid structured_outputs.regex: ("


def test_bad_max_tokens_error_uses_the_request_field_name():
    error = raised(chat, max_completion_tokens=0)
    assert error.param == "max_completion_tokens"
    assert error.message == "max_completion_tokens must be >= 1, got 0"
    assert raised(chat, max_tokens=0).param == "max_tokens"
    assert raised(completion, max_tokens=0).message == "max_tokens must be >= 1, got 0"


# --- logprobs ------------------------------------------------------------------------------


def test_completion_logprobs_and_echo_ask_for_prompt_logprobs():
    assert completion(logprobs=3).logprobs == 3
    assert completion(logprobs=3).prompt_logprobs is None
    echoed = completion(logprobs=2, echo=True)
    assert (echoed.logprobs, echoed.prompt_logprobs) == (2, 2)
    assert completion(echo=True).prompt_logprobs is None


def test_chat_logprobs_flag_and_top_logprobs():
    assert chat(logprobs=True, top_logprobs=5).logprobs == 5
    assert chat(logprobs=True).logprobs == 0
    assert chat(logprobs=False).logprobs is None


# --- logit_bias ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["abc", "-1", "1.5", " 3", ""])
def test_logit_bias_key_that_is_not_a_token_id_names_logit_bias(key):
    error = raised(completion, logit_bias={key: 1.0})
    assert error.param == "logit_bias"
    assert repr(key) in error.message


# --- structured outputs --------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
INTEGER = '{"type": "integer"}'


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"response_format": {"type": "json_object"}}, StructuredOutputsParams(json_object=True)),
        ({"response_format": JSON_SCHEMA_FORMAT}, StructuredOutputsParams(json=SCHEMA)),
        ({"guided_json": SCHEMA}, StructuredOutputsParams(json=SCHEMA)),
        ({"guided_json": INTEGER}, StructuredOutputsParams(json=INTEGER)),
        ({"guided_regex": "[a-z]+"}, StructuredOutputsParams(regex="[a-z]+")),
        ({"guided_choice": ["yes", "no"]}, StructuredOutputsParams(choice=["yes", "no"])),
        ({"guided_grammar": 'root ::= "a"'}, StructuredOutputsParams(grammar='root ::= "a"')),
        ({"structured_outputs": {"regex": "\\d+"}}, StructuredOutputsParams(regex="\\d+")),
        ({"structured_outputs": {"json": SCHEMA}}, StructuredOutputsParams(json=SCHEMA)),
        ({"response_format": {"type": "text"}}, None),
    ],
)
@pytest.mark.parametrize("build", [completion, chat])
def test_structured_output_fields_map_to_one_constraint(build, fields, expected):
    assert build(**fields).structured_outputs == expected


def test_two_structured_output_constraints_are_an_error_naming_the_second():
    error = raised(chat, guided_regex="a", response_format={"type": "json_object"})
    assert error.param == "response_format"
    assert "guided_regex and response_format" in error.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"guided_choice": []}, "guided_choice"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "grammar": "b"}}, "structured_outputs"),
    ],
)
def test_invalid_structured_output_names_its_field(fields, param):
    error = raised(completion, **fields)
    assert error.param == param
    assert error.message.startswith(f"invalid {param}: ")


# --- SamplingParams' own checks ------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("n", 0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -3.0),
        ("top_k", -5),
        ("min_p", 1.5),
        ("repetition_penalty", 0.0),
        ("seed", 2**64),
        ("stop", ["ok", ""]),
    ],
)
@pytest.mark.parametrize("build", [completion, chat])
def test_sampling_params_rejection_names_the_field(build, field, value):
    error = raised(build, **{field: value})
    assert error.param == field
    assert error.message.startswith(field)


def test_min_tokens_beyond_max_tokens_names_min_tokens():
    error = raised(completion, min_tokens=17)
    assert error.param == "min_tokens"
    assert error.message == "min_tokens must be <= max_tokens (16), got 17"


def test_invalid_model_default_is_reported_naming_its_field():
    assert raised(completion, defaults={"top_p": 2.0}).param == "top_p"
